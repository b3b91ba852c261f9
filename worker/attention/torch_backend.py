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
    """Decodes as chunked batched gathers + matmuls; prefill chunks as one SDPA call each."""

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

    def decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor,
    ) -> None:
        """In chunks of `DECODE_CHUNK` sequences, each padded to its own longest."""
        num = q.shape[0]
        lens = meta.seq_lens_host[:num] or tuple(meta.seq_lens[:num].tolist())
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

    def prefill(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor,
    ) -> None:
        out[:] = reference.paged_prefill_attention(
            q, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, scale
        )
