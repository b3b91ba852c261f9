"""Random paged-attention inputs in the `kernels.reference` layout, shared by the kernel tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

# Where the kernels run. CI has no GPU: "cpu" runs them under Triton's interpreter. On a CUDA
# machine, PATERNOSTER_TEST_DEVICE=cuda runs the same cases compiled (inputs are drawn on the CPU
# from the same seeds, then moved), as ops/bench/gpu_check.sh does.
DEVICE = torch.device(os.environ.get("PATERNOSTER_TEST_DEVICE", "cpu"))

# Cache slots no sequence owns hold this value: a kernel that reads past a sequence's length (or
# a padding block-table entry) pulls it into the softmax and misses the tolerance by orders of
# magnitude. Finite, unlike NaN, because the reference reads whole blocks and masks afterwards.
POISON = 1000.0

# Relative error ||out - ref|| / ||ref|| per token (worst token), against the fp32 reference.
# Measured on the interpreter: fp32 ~2e-7, fp16 ~2e-4, bf16 ~3e-3 to 5e-3. bf16 keeps 8 mantissa
# bits: rounding the output alone costs ~1e-3 and rounding the probabilities to bf16 for the P@V
# dot (as FlashAttention does) about as much again; fp16 has 3 more bits. ~2x to 10x margin.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
DTYPES = list(TOLERANCE)


def cpu_has(flag: str) -> bool:
    """Whether this CPU lists ``flag`` (avx512f, amx_bf16, ...): what the native build of our C++
    kernels then compiles in (-march=native)."""
    with open("/proc/cpuinfo") as info:
        return any(line.startswith("flags") and flag in line.split() for line in info)


def dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass
class PagedKV:
    k_cache: torch.Tensor  # (num_blocks, block_size, Hkv, D)
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # (num_seqs, max_blocks) int32, scattered blocks, 0-padded
    seq_lens: torch.Tensor  # (num_seqs,) int32

    def slots(self, seq: int, start: int, end: int) -> torch.Tensor:
        """Cache slots of positions ``[start, end)`` of sequence ``seq`` (int64)."""
        block_size = self.k_cache.shape[2]
        pos = torch.arange(start, end, device=self.block_tables.device)
        return self.block_tables[seq, pos // block_size].long() * block_size + pos % block_size


def make_paged_kv(
    seq_lens: list[int],
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    fill_to: list[int] | None = None,
) -> PagedKV:
    """A cache whose blocks are a random permutation; positions ``< fill_to[b]`` hold K/V."""
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3  # spare blocks no sequence owns
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(seq_lens), max(blocks_per_seq) + 2, dtype=torch.int32)
    used = 0
    for b, n in enumerate(blocks_per_seq):
        tables[b, :n] = perm[used : used + n]
        used += n
    shape = (num_blocks, num_kv_heads, block_size, head_size)
    kv = PagedKV(
        k_cache=torch.full(shape, POISON, dtype=dtype),
        v_cache=torch.full(shape, POISON, dtype=dtype),
        block_tables=tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
    )
    for b, n in enumerate(fill_to if fill_to is not None else seq_lens):
        slots = kv.slots(b, 0, n)
        blocks, offsets = slots // block_size, slots % block_size
        kv.k_cache[blocks, :, offsets] = torch.randn(n, num_kv_heads, head_size, generator=gen).to(
            dtype
        )
        kv.v_cache[blocks, :, offsets] = torch.randn(n, num_kv_heads, head_size, generator=gen).to(
            dtype
        )
    return PagedKV(*(on_device(t) for t in (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens)))


def on_device(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the device the kernels under test run on (a no-op on the CPU)."""
    return t.to(DEVICE)


def query_start_loc(q_lens: list[int]) -> torch.Tensor:
    return on_device(torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Worst per-token ``||out - ref|| / ||ref||``; NaN anywhere (an unwritten row) gives inf."""
    if not torch.isfinite(out).all():
        return float("inf")
    diff = (out.float() - ref.float()).flatten(1).norm(dim=1)
    return float((diff / ref.float().flatten(1).norm(dim=1).clamp_min(1e-6)).max())


def prefill_kernel_error(
    kernel: Callable[..., bool],
    contexts: list[int],
    q_lens: list[int],
    group: int,
    head_size: int,
    block_size: int = 16,
    num_kv_heads: int = 3,
    seed: int = 0,
    cache_dtype: torch.dtype = torch.float32,
) -> float:
    """A C++ prefill kernel's (``kernel(out, q, k_cache, v_cache, block_tables, seq_lens,
    query_start_loc, scale)``) worst per-token relative error against the float32 reference on
    one random step; the kernel must run."""
    from kernels import reference

    gen = torch.Generator().manual_seed(seed)
    kv = make_paged_kv(contexts, num_kv_heads, head_size, block_size, cache_dtype, gen)
    q = torch.randn(sum(q_lens), num_kv_heads * group, head_size, generator=gen)
    args = (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, query_start_loc(q_lens))
    scale = head_size**-0.5
    out = torch.full_like(q, float("nan"))
    assert kernel(out, q, *args, scale)
    return rel_err(out, reference.paged_prefill_attention(q, *args, scale))
