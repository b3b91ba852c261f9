"""The CPU attention backend: our C++ paged decode kernel, torch's path for prefill chunks."""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from worker.attention.backend import KernelCounts
from worker.attention.metadata import AttentionMetadata, KVCache
from worker.attention.torch_backend import TorchAttentionBackend
from worker.models.cpu_kernels import KERNEL_CACHE_DTYPES, use_cpu_kernels
from worker.models.cpu_linear import LinearBackend, pack_linears
from worker.models.decode_stack import install_decode_stack
from worker.models.quant_paths import amx_supported, avx512_bf16_supported


class CpuAttentionBackend(TorchAttentionBackend):
    """Decodes read K/V where they lie (`kernels/cpu_paged_attention.cpp`), no gathered copy.

    On the 32-request peers workload (SmolLM2-135M, fp32, 2 cores) decode attention took
    9.9 s of a 41 s run through the torch backend's gather and batched matmuls. Queries in
    float32 over a float32 or bf16 cache (`CacheConfig.dtype`) take the kernels; other dtypes
    fall back to the torch path.

    Prefill chunks take `kernels/cpu_prefill_attention.cpp` too, in float32 over either cache
    dtype: SDPA's CPU flash kernel multiplies its tiles through MKL, which on AMD runs without
    AVX-512; a 512-token chunk over 1,536 tokens (SmolLM2's heads, 2 threads, Zen 5) took
    12.4 ms a layer in float32 and 15.5 in bf16 there, against 6.6 in the kernel
    (`ops/bench/prefill_attention.py`).

    Where the CPU multiplies bf16 pairs itself, chunks over a bf16 cache attend in bf16 instead
    (q and the probabilities rounded, as llama.cpp's f16 cache does), in
    `kernels/cpu_prefill_bf16.cpp`: AMX tiles where the CPU has them, else AVX-512 BF16 dot
    products (Zen 4 and 5). A 512-token chunk over 1,536 tokens (2 threads, 2026-12-06) took
    2.6 ms in tiles on an AMX Xeon (4.6 in bf16 SDPA, 8.6 in the float32 kernel), and 5.2 ms in
    dot products on a Zen 4 (10.0 in the float32 kernel), 0.3% off float32 (relative norm).
    Where neither runs (a head size not a multiple of 32), the float32 kernel, then SDPA in
    bf16. Decodes, bound by the bytes they read rather than their arithmetic, widen the cache
    to float32 everywhere.
    """

    name = "cpu"

    def __init__(self, ops: ModuleType) -> None:
        super().__init__()
        self.ops = ops  # also the model's fused layer kernels (`install_kernels`)
        # Chunks over a bf16 cache attend with bf16 products where the CPU multiplies bf16
        # natively (AMX tiles, AVX-512 BF16): 1.4-2.4x float32's speed (BENCHMARKS.md).
        self.bf16_prefill = amx_supported() or avx512_bf16_supported()

    def install_kernels(self, model: nn.Module, linear_backend: LinearBackend) -> KernelCounts:
        """The C++ layer kernels come from the same build as the attention kernels: few-row
        projections through `skinny_linear`, norms, SiLU and rotary fused, and where the model
        allows, its layers as one `DecodeStack` for all-decode steps."""
        packed = pack_linears(model, linear_backend, skinny_ops=self.ops)
        counts = KernelCounts(packed, use_cpu_kernels(model, self.ops))
        install_decode_stack(model, self.ops, self)  # all-decode steps: one C++ call
        return counts

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv: KVCache, meta: AttentionMetadata
    ) -> None:
        # Row copies to each slot: the torch path's two advanced-index assignments (and its
        # block and offset divisions) cost ~0.1 ms a layer at decode sizes.
        if kv.k_cache.dtype not in KERNEL_CACHE_DTYPES or not _float_rows(key, value):
            super().write_kv(key, value, kv, meta)
            return
        # The kernel refuses slot -1: leave padding rows out.
        key, value, slots = meta.real_rows(key, value, meta.slot_mapping)
        self.ops.write_kv(key, value, kv.k_cache, kv.v_cache, slots)

    def prefill(
        self, q: torch.Tensor, kv: KVCache, meta: AttentionMetadata, scale: float, out: torch.Tensor
    ) -> None:
        if kv.k_cache.dtype in KERNEL_CACHE_DTYPES and _float_rows(q, out):
            # bf16 products where asked (AMX tiles, else AVX-512 BF16), else float32 arithmetic.
            # Each returns False where it cannot run (the build or CPU lacks its instructions,
            # a head size it does not take): the next one then, and last SDPA in prefill_dtype.
            tables = (meta.block_tables, meta.seq_lens, meta.query_start_loc)
            args = (out, q, kv.k_cache, kv.v_cache, *tables, scale)
            bf16 = self.prefill_dtype(kv) == torch.bfloat16
            if bf16 and self.ops.paged_prefill_attention_bf16(*args):
                return
            if self.ops.paged_prefill_attention(*args):
                return
        super().prefill(q, kv, meta, scale, out)

    def prefill_dtype(self, kv: KVCache) -> torch.dtype | None:
        bf16 = self.bf16_prefill and kv.k_cache.dtype == torch.bfloat16
        return torch.bfloat16 if bf16 else None

    def decode(
        self, q: torch.Tensor, kv: KVCache, meta: AttentionMetadata, scale: float, out: torch.Tensor
    ) -> None:
        if q.dtype != torch.float32 or kv.k_cache.dtype not in KERNEL_CACHE_DTYPES:
            super().decode(q, kv, meta, scale, out)
            return
        q, out = meta.decode_rows(q, out)  # the kernel refuses context 0: padding gets zeros
        num = q.shape[0]
        result = (
            out if _float_rows(out) else torch.empty_like(q, memory_format=torch.contiguous_format)
        )
        self.ops.paged_decode_attention(
            result,
            q if _float_rows(q) else q.contiguous(),
            kv.k_cache,
            kv.v_cache,
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
