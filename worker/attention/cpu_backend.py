"""The CPU attention backend: our C++ paged decode kernel, torch's path for prefill chunks."""

from __future__ import annotations

from types import ModuleType

import torch

from worker.attention.metadata import AttentionMetadata
from worker.attention.torch_backend import TorchAttentionBackend


class CpuAttentionBackend(TorchAttentionBackend):
    """Decodes read K/V where they lie (`kernels/cpu_paged_attention.cpp`), no gathered copy.

    On the 32-request peers workload (SmolLM2-135M, fp32, 2 cores) decode attention took
    9.9 s of a 41 s run through the torch backend's gather and batched matmuls. Prefill chunks
    keep SDPA, whose blocked kernels beat a per-query loop once a chunk has many queries.
    Other dtypes than float32 fall back to the torch path.
    """

    name = "cpu"

    def __init__(self, ops: ModuleType) -> None:
        super().__init__()
        self.ops = ops  # also the model's fused layer kernels (`use_cpu_kernels`)

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> None:
        # Row copies to each slot: the torch path's two advanced-index assignments (and its
        # block and offset divisions) cost ~0.1 ms a layer at decode sizes.
        if k_cache.dtype == torch.float32 and _float_rows(key, value):
            slots = meta.slot_mapping
            if meta.num_padding:  # the kernel refuses slot -1: leave padding rows out
                n = slots.shape[0] - meta.num_padding
                key, value, slots = key[:n], value[:n], slots[:n]
            self.ops.write_kv(key, value, k_cache, v_cache, slots)
        else:
            super().write_kv(key, value, k_cache, v_cache, meta)

    def decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor,
    ) -> None:
        if q.dtype != torch.float32 or k_cache.dtype != torch.float32:
            super().decode(q, k_cache, v_cache, meta, scale, out)
            return
        num = q.shape[0] - meta.num_padding  # the kernel refuses context 0: padding gets zeros
        if meta.num_padding:
            out[num:] = 0
            q, out = q[:num], out[:num]
        result = (
            out if _float_rows(out) else torch.empty_like(q, memory_format=torch.contiguous_format)
        )
        self.ops.paged_decode_attention(
            result,
            q if _float_rows(q) else q.contiguous(),
            k_cache,
            v_cache,
            meta.block_tables[:num],
            meta.seq_lens[:num],
            scale,
        )
        if result is not out:
            out.copy_(result)


def _float_rows(*tensors: torch.Tensor) -> bool:
    """Float32, with heads and elements contiguous within each row: what the kernels take. Rows
    themselves may be strided (q, k and v are views into the fused qkv projection)."""
    return all(
        t.dtype == torch.float32 and t.stride(2) == 1 and t.stride(1) == t.shape[2] for t in tensors
    )
