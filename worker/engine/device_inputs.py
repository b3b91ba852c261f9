"""Static device buffers a step's inputs are copied into, and the tensors each step reads.

The runner used to make six new device tensors a step from Python lists (one synchronous copy
each on CUDA). Here `InputBatch` stages the step's integers in two pinned buffers and this class
sends their used prefixes in two non-blocking copies to buffers allocated once. The block tables
live on the device as a mirror of the host rows, changed by the entries the host changed (one
`index_copy_`), and are gathered into batch order on the device: a step sends the few entries it
appended, not ``num_seqs x max_blocks`` of them (at 128k context with 16-token blocks a row has
8192 entries, 8 MB a step at batch 256).

A decode step padded to a graph size finds every input at the same address as the CUDA graph of
that size captured it (`graph_views`), so replaying the graph runs the step.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from worker.attention import AttentionMetadata
from worker.engine.input_batch import InputBatch
from worker.engine.step_layout import Fields, FieldViews, HostStep


class StepInputs(NamedTuple):
    """What one forward pass reads: packed ids and positions, metadata, rows that sample."""

    input_ids: torch.Tensor  # (T,) int64
    positions: torch.Tensor  # (T,) int64
    meta: AttentionMetadata
    logits_rows: torch.Tensor  # (R,) int64: rows of the hidden states that sample

    @classmethod
    def of(cls, step: HostStep, f: Fields, block_tables: torch.Tensor) -> StepInputs:
        """The inputs of ``step`` from views ``f`` of its staged fields, wherever they lie
        (the host staging buffers, or their device copies)."""
        meta = AttentionMetadata(
            slot_mapping=f.slot_mapping,
            block_tables=block_tables,
            seq_lens=f.seq_lens,
            query_start_loc=f.query_start_loc,
            num_decodes=step.num_decodes,
            max_seq_len=step.max_seq_len,
            max_query_len=step.max_query_len,
            seq_lens_host=step.seq_lens_host,
            num_padding=step.num_padding,
        )
        return cls(f.input_ids, f.positions, meta, f.logits_rows)


class DeviceInputs:
    """Device copies of the staging buffers and of the block tables, allocated once."""

    def __init__(self, batch: InputBatch, device: torch.device, max_model_len: int) -> None:
        batch.mirrored = True
        self.batch = batch
        self.device = device
        self.max_model_len = max_model_len
        self._copied = torch.cuda.Event() if device.type == "cuda" else None
        self._allocate()

    def _allocate(self) -> None:
        b, dev = self.batch, self.device
        self.d64 = torch.zeros(b.stage64.numel(), dtype=torch.int64, device=dev)
        self.d32 = torch.zeros(b.stage32.numel(), dtype=torch.int32, device=dev)
        self.tables = torch.from_numpy(b.tables).to(dev, copy=True)  # the mirror, sent whole
        self.gathered = torch.zeros(b.max_seqs * b.width, dtype=torch.int32, device=dev)
        self.views = FieldViews(self.d64, self.d32)
        self.generation = b.generation

    def wait(self) -> None:
        """Block until the last step's copies have left the staging buffers (done by the time
        its sampled ids reached the host; this keeps it true if that ever overlaps)."""
        if self._copied is not None:
            self._copied.synchronize()

    def load(self, step: HostStep) -> StepInputs:
        """Send the staged step and return its tensors, views of the static buffers."""
        b = self.batch
        if b.generation != self.generation:  # a staging buffer or the table width grew
            self._allocate()
        elif self.tables.shape != b.tables.shape:  # more rows: graphs do not read this one
            self.tables = torch.from_numpy(b.tables).to(self.device, copy=True)
        t, s, w = step.num_tokens, step.num_seqs, step.width
        n64, n32 = step.int64_len, step.int32_len
        self.d64[:n64].copy_(b.stage64[:n64], non_blocking=True)
        self.d32[:n32].copy_(b.stage32[:n32], non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        flat = self.tables.view(-1)
        if step.num_diffs:
            at64, at32 = 3 * t + step.num_logits, 3 * s + 1
            index = self.d64[at64 : at64 + step.num_diffs]
            flat.index_copy_(0, index, self.d32[at32 : at32 + step.num_diffs])
        idx, val = b.take_overflow()
        if idx:  # more changes than the staging buffers hold: rare, so a plain copy
            index = torch.tensor(idx, dtype=torch.int64, device=self.device)
            flat.index_copy_(0, index, torch.tensor(val, dtype=torch.int32, device=self.device))
        f = self.views(t, s, step.num_logits)
        tables = self.gathered[: s * w].view(s, w)
        torch.index_select(self.tables[:, :w], 0, f.table_rows, out=tables)
        return StepInputs.of(step, f, tables)

    def graph_views(self, size: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """ids, positions and metadata of a decode step padded to ``size`` rows, where `load`
        puts them: what the graph of that size captures.

        A graph freezes the host values too. ``max_seq_len`` is max_model_len: the Triton decode
        kernel sizes its split-K grid from it (the split count, once per captured size), and
        each sequence cuts its own length into those splits at replay, none shorter than
        `kernels.triton_decode.MIN_SPLIT_TOKENS` (batch 32, 128k max_model_len: 3 splits; a
        527-token context uses all three, where one split of 43,712 tokens held it until
        2026-12-04). ``num_padding`` stays 0: the kernels see slot -1 and seq_len 0 themselves.
        """
        f = self.views(size, size, 0)
        w = self.batch.width
        meta = AttentionMetadata(
            slot_mapping=f.slot_mapping,
            block_tables=self.gathered[: size * w].view(size, w),
            seq_lens=f.seq_lens,
            query_start_loc=f.query_start_loc,
            num_decodes=size,
            max_seq_len=self.max_model_len,
            max_query_len=1,
        )
        return f.input_ids, f.positions, meta

    def fill_padding(self, size: int) -> None:
        """Make every row of ``size`` a padding row (capture writes nowhere, reads nothing)."""
        t = s = size
        self.d64[: 2 * t] = 0
        self.d64[2 * t : 3 * t] = -1
        self.d32[:s] = 0
        self.d32[s : 2 * s + 1] = torch.arange(s + 1, dtype=torch.int32, device=self.device)
        self.gathered[: s * self.batch.width] = 0
