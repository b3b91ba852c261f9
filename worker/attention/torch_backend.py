"""The torch attention backend: the CPU path, built on `kernels.reference`."""

from __future__ import annotations

import torch

from kernels import reference
from worker.attention.backend import AttentionBackend
from worker.attention.metadata import AttentionMetadata, KVCache

# Decodes gathered 16 sequences at a time keep the gathered K/V in cache: 64 sequences of 600
# tokens (SmolLM2 shapes, 2 cores) took 6.6 ms a layer in chunks of 8-16 against 9.1 ms in one
# gather, which spills 30 MB per K and V out of L2/L3. Chunks also pad only to their own longest.
DECODE_CHUNK = 16


class TorchAttentionBackend(AttentionBackend):
    """Decodes as chunked batched gathers + matmuls; prefill chunks as one SDPA call each."""

    name = "torch"

    def __init__(self) -> None:
        # Gather workspaces reused across layers and steps (see `reference.gather_kv`).
        self._buffers: dict[str, torch.Tensor] = {}

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv: KVCache, meta: AttentionMetadata
    ) -> None:
        # Slot -1 would index the pool's last slot: leave padding rows out.
        key, value, slots = meta.real_rows(key, value, meta.slot_mapping)
        reference.write_kv(key, value, kv.k_cache, kv.v_cache, slots)

    def decode(
        self, q: torch.Tensor, kv: KVCache, meta: AttentionMetadata, scale: float, out: torch.Tensor
    ) -> None:
        """In chunks of `DECODE_CHUNK` sequences, each padded to its own longest."""
        q, out = meta.decode_rows(q, out)
        num = q.shape[0]
        lens = meta.seq_lens_host[:num] or tuple(meta.seq_lens[:num].tolist())
        k_cache, v_cache = kv
        _, num_kv_heads, block_size, head_size = k_cache.shape
        for start in range(0, num, DECODE_CHUNK):
            end = min(num, start + DECODE_CHUNK)
            max_len = max(lens[start:end])
            num_blocks = -(-max_len // block_size)
            tile = (num_kv_heads, block_size, head_size)
            shape = (end - start, num_kv_heads, num_blocks * block_size, head_size)
            scratch = self._buffer("scratch", ((end - start) * num_blocks, *tile), k_cache)
            tables = meta.block_tables[start:end]
            k = reference.gather_kv(
                k_cache, tables, max_len, self._buffer("k", shape, k_cache), scratch
            )
            v = reference.gather_kv(
                v_cache, tables, max_len, self._buffer("v", shape, k_cache), scratch
            )
            out[start:end] = reference.attend_gathered(
                q[start:end], k, v, meta.seq_lens[start:end], scale
            )

    def _buffer(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """A reused workspace view of ``shape``: grows, never shrinks, per name."""
        numel = 1
        for size in shape:
            numel *= size
        buf = self._buffers.get(name)
        if (
            buf is None
            or buf.numel() < numel
            or buf.dtype != like.dtype
            or buf.device != like.device
        ):
            buf = torch.empty(numel, dtype=like.dtype, device=like.device)
            self._buffers[name] = buf
        return buf[:numel].view(shape)

    def prefill(
        self, q: torch.Tensor, kv: KVCache, meta: AttentionMetadata, scale: float, out: torch.Tensor
    ) -> None:
        out[:] = reference.paged_prefill_attention(
            q,
            *kv,
            meta.block_tables,
            meta.seq_lens,
            meta.query_start_loc,
            scale,
            self.prefill_dtype(kv),
        )

    def prefill_dtype(self, kv: KVCache) -> torch.dtype | None:
        """The dtype prefill's SDPA runs in; None: the reference's (float32)."""
        return None
