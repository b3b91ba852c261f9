"""The persistent batch: per-row host state kept across steps, and each step's inputs staged.

`ModelRunner.prepare` used to rebuild every list in Python, per token, each step, and make new
tensors of them. Here a sequence keeps its row (matched by ``seq_id``) while it is scheduled in
consecutive steps: its block table stays in a preallocated array and grows by the blocks
appended (a decode adds one every ``block_size`` steps); positions and slot mappings come from
whole-array numpy ops over those rows; and the step's integers are written into two staging
buffers (pinned on CUDA) whose used prefixes `DeviceInputs` sends in two non-blocking copies.

A row continues from a step to the next when the sequence's num_computed_tokens is where the
last step left it; otherwise (a step redone for one sequence by `step_faults`, a recompute after
preemption) its table is compared whole and rewritten where it differs. A sequence not in a
step gives up its row, as do the preempted ones (`forget`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from itertools import chain

import numpy as np
import numpy.typing as npt
import torch

from worker.engine.scheduler_output import ScheduledSequence
from worker.engine.step_layout import HostStep

Ints = npt.NDArray[np.int64]


class InputBatch:
    """Block tables by row, rows by sequence id, and the staging buffers of each step."""

    def __init__(
        self, max_seqs: int, max_tokens: int, width: int, block_size: int, pin: bool
    ) -> None:
        self.block_size = block_size
        self.pin = pin
        self.mirrored = False  # set by `DeviceInputs`: record table changes for its device copy
        # Bumped when the staging buffers or the table width change: the device buffers are
        # reallocated and graphs captured over them go stale. More rows only extend the tables.
        self.generation = 0
        self._rows: dict[int, int] = {}  # seq_id -> row
        self._free: list[int] = []
        self._mark: list[int] = []  # per row: the last step that claimed it
        self._ids: list[tuple[int, ...]] = []  # per row: the block table it holds
        self._dirty: list[int] = []  # per row: entries that may be non-zero
        self._ends: list[int] = []  # per row: num_computed_tokens after its last step
        self._owner: list[str] = []  # per row: the request id
        self._scratch: list[int] = []  # rows lent this step to a repeated seq_id
        self._step = 0
        self._diff_idx: list[int] = []
        self._diff_val: list[int] = []
        self.tables = np.zeros((0, width), np.int32)
        # Rows of leaving sequences are freed after the step's joiners took theirs: room for a
        # full batch leaving and another joining in one step (preemption churn) without growth.
        self._grow_rows(2 * max_seqs)
        self._alloc_staging(max_seqs, max_tokens)

    @property
    def width(self) -> int:
        return int(self.tables.shape[1])

    @property
    def zero_row(self) -> int:
        """A row never lent, all zeros: the table of every padding row."""
        return int(self.tables.shape[0]) - 1

    # -- rows ----------------------------------------------------------------------------------

    def claim(self, items: Sequence[ScheduledSequence]) -> list[int]:
        """Each item's row, its block table brought up to date; rows of absent sequences freed."""
        self._step = step = self._step + 1
        rows: list[int] = []
        row_of, mark, held, ends = self._rows, self._mark, self._ids, self._ends
        for item in items:
            row = row_of.get(item.seq_id)
            if row is None or mark[row] == step:
                row = self._new_row(item, row is not None)
            mark[row] = step
            new, old = item.block_ids, held[row]
            n_old = len(old)
            start = item.num_computed_tokens
            if start == ends[row] and n_old and len(new) >= n_old and new[n_old - 1] == old[-1]:
                # The step after this row's last: its table can only have grown (a sequence's
                # blocks change only when freed, and then it leaves the batch or is announced
                # in preempted_ids), so only the tail is read. A full compare costs ~10 ns a
                # block: 1.3 ms a step at batch 256 with 8k-token contexts.
                if len(new) > n_old:
                    self._write(row, n_old, new)
            elif new != old:
                self._rewrite(row, old, new)
            ends[row] = start + len(item.token_ids)
            rows.append(row)
        lent, self._scratch = self._scratch, []
        for row in lent:
            self._release(row)
        if len(row_of) > len(items) - len(lent):
            self._release_where(lambda row: mark[row] != step)
        return rows

    def forget(self, request_ids: Collection[str]) -> None:
        """Free the rows of ``request_ids``' sequences (preempted: their blocks were freed)."""
        if request_ids:
            owner = self._owner
            self._release_where(lambda row: owner[row] in request_ids)

    def _release_where(self, pred: Callable[[int], bool]) -> None:
        for seq_id, row in [(s, r) for s, r in self._rows.items() if pred(r)]:
            del self._rows[seq_id]
            self._release(row)

    def _new_row(self, item: ScheduledSequence, repeated: bool) -> int:
        """A free row for ``item``; for a seq_id repeated within one step, lent for the step."""
        row = self._take()
        if repeated:
            self._scratch.append(row)
        else:
            self._rows[item.seq_id] = row
        self._owner[row] = item.request_id
        return row

    def _rewrite(self, row: int, old: tuple[int, ...], new: tuple[int, ...]) -> None:
        """Append the blocks ``new`` adds to ``old``, or rewrite the row if it changed."""
        n_old = len(old)
        self._write(row, n_old if len(new) > n_old and new[:n_old] == old else 0, new)

    def _write(self, row: int, start: int, new: tuple[int, ...]) -> None:
        """Entries ``[start, len(new))`` of the row from ``new``, zeros past it."""
        n = len(new)
        if n > self.width:
            self._grow_width(n)
        part = new[start:]
        self.tables[row, start:n] = part
        dirty = self._dirty[row]
        if dirty > n:  # a shorter table than the row held: zero its tail, as the old padding
            self.tables[row, n:dirty] = 0
        if self.mirrored:
            base = row * self.width
            self._diff_idx.extend(range(base + start, base + max(n, dirty)))
            self._diff_val.extend(part)
            self._diff_val.extend([0] * (dirty - n))
        self._dirty[row] = n
        self._ids[row] = new

    def _take(self) -> int:
        if not self._free:
            self._grow_rows(2 * self.zero_row)
        return self._free.pop()

    def _release(self, row: int) -> None:
        # The entries stay until the row's next holder overwrites them (and zeros the rest).
        self._ids[row] = ()
        self._mark[row] = self._ends[row] = -1
        self._free.append(row)

    def _grow_rows(self, rows: int) -> None:
        old = self.zero_row if self.tables.shape[0] else 0
        tables = np.zeros((rows + 1, self.width), np.int32)
        tables[:old] = self.tables[:old]
        self.tables = tables
        self._free = list(range(rows - 1, old - 1, -1)) + self._free  # low rows lent first
        extra = rows - old
        self._mark += [-1] * extra
        self._ids += [()] * extra
        self._dirty += [0] * extra
        self._ends += [-1] * extra
        self._owner += [""] * extra

    def _grow_width(self, width: int) -> None:
        tables = np.zeros((self.tables.shape[0], max(width, 2 * self.width)), np.int32)
        tables[:, : self.width] = self.tables
        self.tables = tables
        # Flat indices are relative to the old width: the device copy is re-sent whole instead.
        self._diff_idx.clear()
        self._diff_val.clear()
        self.generation += 1

    # -- staging -------------------------------------------------------------------------------

    def _alloc_staging(self, max_seqs: int, max_tokens: int) -> None:
        self.max_seqs, self.max_tokens = max_seqs, max_tokens
        # Room for the table changes of a busy step (new sequences bring their cached prefix's
        # blocks); more go to the device the slow way (`take_overflow`), never lost.
        self.max_diffs = max(4096, 2 * max_tokens)
        self.stage64 = torch.zeros(
            3 * max_tokens + max_seqs + self.max_diffs, dtype=torch.int64, pin_memory=self.pin
        )
        self.stage32 = torch.zeros(
            3 * max_seqs + 1 + self.max_diffs, dtype=torch.int32, pin_memory=self.pin
        )
        self.np64: Ints = self.stage64.numpy()
        self.np32: npt.NDArray[np.int32] = self.stage32.numpy()
        self._arange: Ints = np.arange(max(max_tokens, max_seqs) + 1, dtype=np.int64)
        self.generation += 1

    def stage(self, items: Sequence[ScheduledSequence], pad_to: int | None = None) -> HostStep:
        """Write the step of ``items`` (packed in this order) into the staging buffers.

        ``pad_to``: a decode-only step is padded with rows of one token at slot -1, context 0
        and the all-zero table row, up to that many rows.
        """
        rows = self.claim(items)
        qlens = [len(item.token_ids) for item in items]
        starts = [item.num_computed_tokens for item in items]
        real_seqs, real_tokens = len(items), sum(qlens)
        if pad_to is not None and (real_tokens != real_seqs or pad_to < real_seqs):
            raise ValueError(f"only a decode-only step of <= {pad_to} rows pads to {pad_to}")
        s = pad_to or real_seqs
        t = real_tokens + s - real_seqs
        if t > self.max_tokens or s > self.max_seqs:
            self._alloc_staging(max(s, self.max_seqs), max(t, self.max_tokens))
        a64, a32 = self.np64, self.np32
        a64[:real_tokens] = list(chain.from_iterable([item.token_ids for item in items]))
        a32[2 * s + 1 : 2 * s + 1 + real_seqs] = rows
        if real_tokens == real_seqs:
            self._decode_rows(starts, t, s)
        else:
            self._chunk_rows(starts, qlens, t, s)
        num_logits = self._logits_rows([item.samples for item in items], t, s)
        if s > real_seqs:
            self._pad(real_tokens, real_seqs, t, s)
        lens = tuple(a32[:s].tolist())
        return HostStep(
            num_tokens=t,
            num_seqs=s,
            num_logits=num_logits,
            num_diffs=self._stage_diffs(3 * t + num_logits, 3 * s + 1),
            width=self.width if pad_to else max([len(item.block_ids) for item in items]),
            num_decodes=qlens.count(1) + s - real_seqs,
            num_padding=s - real_seqs,
            max_seq_len=max(lens[:real_seqs]),
            max_query_len=max(qlens),
            seq_lens_host=lens,
        )

    def _decode_rows(self, starts: list[int], t: int, s: int) -> None:
        """positions, seq_lens, query_start_loc and slots of a step of one token per row."""
        n, a64, a32 = len(starts), self.np64, self.np32
        pos = a64[t : t + n]
        pos[:] = starts
        np.add(pos, 1, out=a32[:n])
        a32[s : s + n + 1] = self._arange[: n + 1]
        self._slots(a32[2 * s + 1 : 2 * s + 1 + n], pos, a64[2 * t : 2 * t + n])

    def _chunk_rows(self, starts: list[int], qlens: list[int], t: int, s: int) -> None:
        """The same for a step with prefill chunks: per-row values repeated per token."""
        n, a64, a32 = len(starts), self.np64, self.np32
        q: Ints = np.array(qlens, dtype=np.int64)
        first: Ints = np.array(starts, dtype=np.int64)
        ends = np.cumsum(q)
        num = int(ends[-1])
        pos = a64[t : t + num]
        # Token j of a row whose first new token is at position p and query offset o: p + j - o.
        np.add(self._arange[:num], np.repeat(first - (ends - q), q), out=pos)
        np.add(first, q, out=a32[:n])
        a32[s] = 0
        a32[s + 1 : s + 1 + n] = ends
        rows = np.repeat(a32[2 * s + 1 : 2 * s + 1 + n], q)
        self._slots(rows, pos, a64[2 * t : 2 * t + num])

    def _slots(self, rows: npt.NDArray[np.int32], pos: Ints, out: Ints) -> None:
        """Cache slot of each token: its row's block at ``pos // block_size``, plus offset."""
        bs = self.block_size
        out[:] = self.tables[rows, pos // bs]
        out *= bs
        out += pos % bs

    def _logits_rows(self, samples: list[bool], t: int, s: int) -> int:
        """Write the last query row of each row that samples, at ``[3T, 3T+R)``; R."""
        out, ends = self.np64[3 * t :], self.np32[s + 1 : s + 1 + len(samples)]
        if all(samples):
            num = len(samples)
            np.subtract(ends, 1, out=out[:num])
            return num
        picked = ends[np.array(samples, dtype=np.bool_)]
        num = len(picked)
        np.subtract(picked, 1, out=out[:num])
        return num

    def _pad(self, real_tokens: int, real_seqs: int, t: int, s: int) -> None:
        a64, a32 = self.np64, self.np32
        a64[real_tokens:t] = 0  # token 0 at position 0: any valid input
        a64[t + real_tokens : 2 * t] = 0
        a64[2 * t + real_tokens : 3 * t] = -1  # writes nowhere
        a32[real_seqs:s] = 0  # reads nothing
        last = int(a32[s + real_seqs])
        a32[s + real_seqs + 1 : 2 * s + 1] = self._arange[1 : s - real_seqs + 1] + last
        a32[2 * s + 1 + real_seqs : 3 * s + 1] = self.zero_row

    def _stage_diffs(self, at64: int, at32: int) -> int:
        """Stage the table changes for the device copy, if they fit; how many were staged."""
        num = len(self._diff_idx)
        if not num or num > self.max_diffs:
            return 0  # none, or the slow way (`take_overflow`)
        self.np64[at64 : at64 + num] = self._diff_idx
        self.np32[at32 : at32 + num] = self._diff_val
        self._diff_idx.clear()
        self._diff_val.clear()
        return num

    def take_overflow(self) -> tuple[list[int], list[int]]:
        """Table changes too many to stage (flat indices, values); the caller applies them."""
        idx, val = self._diff_idx, self._diff_val
        self._diff_idx, self._diff_val = [], []
        return idx, val

    def gather_tables(self, step: HostStep) -> npt.NDArray[np.int32]:
        """The step's block tables in batch order, ``(S, width)`` (the CPU path's)."""
        s = step.num_seqs
        return self.tables[self.np32[2 * s + 1 : 3 * s + 1], : step.width]
