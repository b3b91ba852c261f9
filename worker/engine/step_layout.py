"""Where each field of a step lies in the two integer buffers it is staged and sent in.

`InputBatch` writes a step into pinned host buffers in this layout, `DeviceInputs` copies their
used prefixes to device buffers laid out the same, and both hand out views of the fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass(frozen=True)
class HostStep:
    """A staged step: the sizes that locate each field in the staging buffers, and host values.

    int64 buffer: input ids ``[0, T)``, positions ``[T, 2T)``, slots ``[2T, 3T)``, logits rows
    ``[3T, 3T+R)``, then the flat indices of the block-table entries changed this step ``(D)``.
    int32 buffer: seq_lens ``[0, S)``, query_start_loc ``[S, 2S+1)``, each batch row's table row
    ``[2S+1, 3S+1)``, then the changed entries' values ``(D)``. A decode step padded to a graph
    size has ``T == S``, so every field sits where that size's graph reads it.
    """

    num_tokens: int  # T, padding included
    num_seqs: int  # S, padding included
    num_logits: int  # R: rows that sample
    num_diffs: int  # D
    width: int  # block-table columns of this step
    num_decodes: int
    num_padding: int  # trailing padding rows (one token each)
    max_seq_len: int
    max_query_len: int
    seq_lens_host: tuple[int, ...]

    @property
    def int64_len(self) -> int:
        return 3 * self.num_tokens + self.num_logits + self.num_diffs

    @property
    def int32_len(self) -> int:
        return 3 * self.num_seqs + 1 + self.num_diffs


class Fields(NamedTuple):
    """Views of one step's fields in a pair of buffers laid out as `HostStep` says."""

    input_ids: torch.Tensor  # (T,) int64
    positions: torch.Tensor  # (T,) int64
    slot_mapping: torch.Tensor  # (T,) int64
    logits_rows: torch.Tensor  # (R,) int64
    seq_lens: torch.Tensor  # (S,) int32
    query_start_loc: torch.Tensor  # (S + 1,) int32
    table_rows: torch.Tensor  # (S,) int32: each batch row's row of the block tables


class FieldViews:
    """`Fields` of a pair of buffers by step size, cached: a decode batch keeps its size for
    many steps, and making the seven views anew took ~20 us a step (3 us a torch slice)."""

    def __init__(self, i64: torch.Tensor, i32: torch.Tensor) -> None:
        self.i64, self.i32 = i64, i32
        self._cache: dict[tuple[int, int, int], Fields] = {}

    def __call__(self, t: int, s: int, r: int) -> Fields:
        fields = self._cache.get((t, s, r))
        if fields is None:
            i64, i32 = self.i64, self.i32
            fields = Fields(
                input_ids=i64[:t],
                positions=i64[t : 2 * t],
                slot_mapping=i64[2 * t : 3 * t],
                logits_rows=i64[3 * t : 3 * t + r],
                seq_lens=i32[:s],
                query_start_loc=i32[s : 2 * s + 1],
                table_rows=i32[2 * s + 1 : 3 * s + 1],
            )
            if len(self._cache) > 4096:  # sizes of prefill steps vary without end
                self._cache.clear()
            self._cache[(t, s, r)] = fields
        return fields
