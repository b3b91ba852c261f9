"""The persistent batch's rows: each sequence's block table, kept across steps.

A sequence keeps its row (matched by ``seq_id``) while it is scheduled in consecutive steps: its
block table stays in a preallocated array and grows by the blocks appended (a decode adds one
every ``block_size`` steps). A row continues from a step to the next when the sequence's
num_computed_tokens is where the last step left it; otherwise (a step redone for one sequence
by `step_faults`, a recompute after preemption) its table is compared whole and rewritten
where it differs. A sequence not in a step gives up its row, as do the preempted ones
(`forget`). With a device mirror (`DeviceInputs`), each changed entry is recorded, to be sent.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import numpy as np
import numpy.typing as npt

from worker.engine.scheduler_output import ScheduledSequence


class BlockTables:
    """Block tables by row, rows by sequence id, and the entries changed since last taken."""

    def __init__(self, max_seqs: int, width: int) -> None:
        self.mirrored = False  # set by `DeviceInputs`: record table changes for its device copy
        # Bumped when the width changes: flat indices into the tables move. More rows only
        # extend them.
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
        self.diff_idx: list[int] = []  # flat indices of entries changed since `take_diffs`
        self.diff_val: list[int] = []
        self.tables = np.zeros((0, width), np.int32)
        # Rows of leaving sequences are freed after the step's joiners took theirs: room for a
        # full batch leaving and another joining in one step (preemption churn) without growth.
        self._grow_rows(2 * max_seqs)

    @property
    def width(self) -> int:
        return int(self.tables.shape[1])

    @property
    def zero_row(self) -> int:
        """A row never lent, all zeros: the table of every padding row."""
        return int(self.tables.shape[0]) - 1

    def claim(self, items: Sequence[ScheduledSequence]) -> list[int]:
        """Each item's row, its block table brought up to date; rows of absent sequences freed."""
        self._step = step = self._step + 1
        rows: list[int] = []
        row_of, mark, held, ends = self._rows, self._mark, self._ids, self._ends
        # Unpacked in one go rather than read field by field: 256 steady decode rows, 0.045 ->
        # 0.042 ms (thread CPU time, Zen 4; `pieces.py`, BENCHMARKS.md "thirteenth pass").
        for item in items:
            _, token_ids, start, new, _, seq_id = item
            row = row_of.get(seq_id)
            if row is None or mark[row] == step:
                row = self._new_row(item, row is not None)
            mark[row] = step
            old = held[row]
            if new is old and start == ends[row]:
                # The step after this row's last, its table unchanged: a sequence's table is a
                # tuple replaced when it grows (`Sequence.block_ids`), 15 of 16 decode steps.
                ends[row] = start + len(token_ids)
                rows.append(row)
                continue
            n_old = len(old)
            if start == ends[row] and n_old and len(new) >= n_old and new[n_old - 1] == old[-1]:
                # The step after this row's last: its table can only have grown (a sequence's
                # blocks change only when freed, and then it leaves the batch or is announced
                # in preempted_ids), so only the tail is read. A full compare costs ~10 ns a
                # block: 1.3 ms a step at batch 256 with 8k-token contexts.
                if len(new) > n_old:
                    self._write(row, n_old, new)
            elif new != old:
                self._rewrite(row, old, new)
            ends[row] = start + len(token_ids)
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

    def take_diffs(self) -> tuple[list[int], list[int]]:
        """The entries changed since the last call (flat indices, values), and forget them."""
        idx, val = self.diff_idx, self.diff_val
        self.diff_idx, self.diff_val = [], []
        return idx, val

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
            self.diff_idx.extend(range(base + start, base + max(n, dirty)))
            self.diff_val.extend(part)
            self.diff_val.extend([0] * (dirty - n))
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
        self.diff_idx.clear()
        self.diff_val.clear()
        self.generation += 1

    def gather(self, rows: npt.NDArray[np.int32], width: int) -> npt.NDArray[np.int32]:
        """The tables of ``rows`` in that order, ``(len(rows), width)``."""
        return self.tables[rows, :width]
