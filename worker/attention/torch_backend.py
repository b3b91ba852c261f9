"""The torch attention backend: the CPU path, built on `kernels.reference`."""

from __future__ import annotations

import torch

from kernels import reference
from worker.attention.backend import AttentionBackend
from worker.attention.metadata import AttentionMetadata

# Decodes gathered 16 sequences at a time keep the gathered K/V in cache: 64 sequences of 600
# tokens (SmolLM2 shapes, 2 cores) took 6.6 ms a layer in chunks of 8-16 against 9.1 ms in one
# gather, which spills 30 MB per K and V out of L2/L3. Chunks also pad only to their own longest.
DECODE_CHUNK = 16


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
        out = torch.empty_like(q)
        if d:
            out[:d] = self._decode(q[:d], k_cache, v_cache, meta, scale)
        if d < meta.num_seqs:
            pre = meta.prefill_part()
            out[d:] = reference.paged_prefill_attention(
                q[d:], k_cache, v_cache, pre.block_tables, pre.seq_lens, pre.query_start_loc, scale
            )
        return out

    def _decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Decodes in chunks of `DECODE_CHUNK` sequences, each padded to its own longest."""
        num = q.shape[0]
        lens = meta.seq_lens_host[:num] or tuple(meta.seq_lens[:num].tolist())
        out = torch.empty_like(q)
        for start in range(0, num, DECODE_CHUNK):
            end = min(num, start + DECODE_CHUNK)
            out[start:end] = reference.paged_decode_attention(
                q[start:end],
                k_cache,
                v_cache,
                meta.block_tables[start:end],
                meta.seq_lens[start:end],
                scale,
                max(lens[start:end]),
            )
        return out
