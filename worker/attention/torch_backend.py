"""The torch attention backend: the CPU path, built on `kernels.reference`."""

from __future__ import annotations

import torch

from kernels import reference
from worker.attention.backend import AttentionBackend
from worker.attention.metadata import AttentionMetadata


class TorchAttentionBackend(AttentionBackend):
    """Decodes as one batched gather + matmul; prefill chunks as one SDPA call each."""

    name = "torch"

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> None:
        reference.write_kv(key, value, k_cache, v_cache, meta.slot_mapping)

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        d = meta.num_decodes
        if d == meta.num_seqs:
            return reference.paged_decode_attention(
                q, k_cache, v_cache, meta.block_tables, meta.seq_lens, scale, meta.max_seq_len
            )
        out = torch.empty_like(q)
        if d:
            out[:d] = reference.paged_decode_attention(
                q[:d],
                k_cache,
                v_cache,
                meta.block_tables[:d],
                meta.seq_lens[:d],
                scale,
                int(meta.seq_lens[:d].max().item()),
            )
        pre = meta.prefill_part()
        out[d:] = reference.paged_prefill_attention(
            q[d:], k_cache, v_cache, pre.block_tables, pre.seq_lens, pre.query_start_loc, scale
        )
        return out
