"""Per-step attention metadata: what every layer's attention needs to find its K/V in the cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch


class KVCache(NamedTuple):
    """One layer's paged cache, K and V each ``(num_blocks, Hkv, block_size, D)``."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor


@dataclass(frozen=True)
class AttentionMetadata:
    """Tensors and host-side sizes for one packed step; the layout is `kernels.reference`'s.

    The runner orders sequences so that the first ``num_decodes`` have exactly one query token each
    (decodes); the rest are prefill chunks. Backends use this split to pick a decode kernel (one
    query per sequence, flash-decoding) and a varlen extend kernel for the rest.
    """

    slot_mapping: torch.Tensor  # (num_tokens,) int64: cache slot of each new token
    block_tables: torch.Tensor  # (num_seqs, max_blocks) int32, padded with 0
    seq_lens: torch.Tensor  # (num_seqs,) int32: context length including this step's tokens
    query_start_loc: torch.Tensor  # (num_seqs + 1,) int32: cumulative query lengths
    num_decodes: int  # leading sequences with query length 1
    max_seq_len: int  # max of seq_lens, on the host (no device sync to size grids)
    max_query_len: int  # max query length, on the host
    seq_lens_host: tuple[int, ...] = ()  # seq_lens on the host, where the runner has them
    # Trailing rows of a decode batch padded to a CUDA-graph size, one token each, with slot -1
    # (write nowhere) and seq_len 0 (read nothing). Host-side backends skip them by this count;
    # device kernels must not read it (a graph freezes it at capture) and see slot and length.
    num_padding: int = 0

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    def real_rows(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``tensors`` (first dimension: rows of this step) without the trailing padding rows:
        what host-side kernels take, since slot -1 and context 0 are refused or misread there."""
        if not self.num_padding:
            return tensors
        num = tensors[0].shape[0] - self.num_padding
        return tuple(t[:num] for t in tensors)

    def decode_rows(self, q: torch.Tensor, out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The real rows of a decode's ``q`` and ``out``; the padding rows' output is zeroed
        (they attend to nothing)."""
        if self.num_padding:
            out[q.shape[0] - self.num_padding :] = 0
        return self.real_rows(q, out)

    def prefill_part(self) -> AttentionMetadata:
        """The metadata of the prefill sequences only, with query offsets rebased to 0."""
        d = self.num_decodes
        qsl = self.query_start_loc[d:] - self.query_start_loc[d]
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[d:],
            block_tables=self.block_tables[d:],
            seq_lens=self.seq_lens[d:],
            query_start_loc=qsl,
            num_decodes=0,
            max_seq_len=self.max_seq_len,
            max_query_len=self.max_query_len,
            seq_lens_host=self.seq_lens_host[d:],
        )
