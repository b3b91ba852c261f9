"""`kernels/cpu_prefill_bf16.cpp` (prefill attention over a bf16 cache with bf16 products: AMX
tiles, `cpu_prefill_amx.cpp`, or AVX-512 BF16 dot products) against the float32 reference over
the same cache, each instruction set on its own (`tiles=False` keeps an AMX CPU to the dots).

q and the probabilities are rounded to bf16, so the kernel agrees with float32 SDPA to bf16's
tolerance (measured ~2-3e-3, against bf16 SDPA's ~3e-3), not float32's. Unowned cache slots hold
`paged_cases.POISON`: a read past a context or a key after a query's own position misses the
tolerance by far. A CPU without one of the instruction sets skips its checks; the checks of
arguments and of the declining build run everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from types import ModuleType

import pytest
import torch
from paged_cases import (
    TOLERANCE,
    cpu_has,
    make_paged_kv,
    prefill_kernel_error,
    query_start_loc,
    rel_err,
)

from kernels import cpu_ops, reference

# Each instruction set: the CPU flag it needs, and whether the call may use tiles.
PATHS = {"tiles": ("amx_bf16", True), "dots": ("avx512_bf16", False)}


@pytest.fixture(scope="module")
def ops() -> ModuleType:
    module = cpu_ops.load()
    assert module is not None, cpu_ops.unavailable_reason()
    return module


@pytest.fixture(params=list(PATHS))
def kernel(request: pytest.FixtureRequest, ops: ModuleType) -> Callable[..., bool]:
    flag, tiles = PATHS[request.param]
    if not cpu_has(flag):
        pytest.skip(f"no {flag} on this CPU: the {request.param} do not run here")
    return partial(ops.paged_prefill_attention_bf16, tiles=tiles)


@pytest.mark.parametrize(
    ("group", "head_size", "block_size", "num_kv_heads"),
    [
        (3, 64, 16, 3),
        (1, 64, 16, 2),
        (4, 128, 32, 2),
        (8, 128, 16, 1),
        (3, 64, 7, 1),
        (3, 96, 16, 1),  # tiles take 64 and 128 only: dot products, tiles asked or not
        (2, 32, 16, 2),
    ],
)
def test_prefill_matches_the_float32_reference(
    kernel: Callable[..., bool], group: int, head_size: int, block_size: int, num_kv_heads: int
) -> None:
    """Fresh prompts and chunks after earlier tokens, of lengths off the block, the 32-key
    pair of blocks and the 16-row block (rows are tokens x group), and so off the dot
    products' 8- and 4-row passes; one query alone."""
    contexts = [1, 17, 100, 300, 95, 64, 33]
    q_lens = [1, 17, 37, 300, 1, 64, 5]
    error = prefill_kernel_error(
        kernel, contexts, q_lens, group, head_size, block_size, num_kv_heads, 0, torch.bfloat16
    )
    assert 0 < error < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_contexts_past_one_chunk_of_keys(kernel: Callable[..., bool], threads: int) -> None:
    """Scores are kept 512 keys at a time: a 530-token chunk over 1,100 tokens (three chunks of
    keys, the running max and sum carried across) beside a fresh 513-token prompt."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        error = prefill_kernel_error(
            kernel, [1100, 513], [530, 513], 3, 64, seed=threads, cache_dtype=torch.bfloat16
        )
    finally:
        torch.set_num_threads(before)
    assert error < TOLERANCE[torch.bfloat16]


def test_query_rows_may_be_strided(kernel: Callable[..., bool]) -> None:
    """q as the engine hands it over, a view into the fused qkv projection, and strided out."""
    gen = torch.Generator().manual_seed(8)
    kv = make_paged_kv([90, 40], 3, 64, 16, torch.bfloat16, gen)
    q = torch.randn(60 + 40, 9 + 2 * 3, 64, generator=gen)[:, :9]
    args = (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, query_start_loc([60, 40]))
    out = torch.full((100, 12, 64), float("nan"))[:, :9]
    assert kernel(out, q, *args, 0.125)
    ref = reference.paged_prefill_attention(q.contiguous(), *args, 0.125)
    assert rel_err(out, ref) < TOLERANCE[torch.bfloat16]


def test_a_step_without_queries_writes_nothing(kernel: Callable[..., bool]) -> None:
    gen = torch.Generator().manual_seed(3)
    kv = make_paged_kv([20], 1, 64, 16, torch.bfloat16, gen)
    q = torch.zeros(0, 3, 64)
    args = (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, query_start_loc([0]), 0.125)
    assert kernel(torch.zeros(0, 3, 64), q, *args)


@pytest.mark.parametrize("head_size", [16, 48, 80])
def test_other_head_sizes_are_left_to_the_caller(ops, head_size: int) -> None:  # type: ignore[no-untyped-def]
    """Heads not a multiple of 32: False, with ``out`` untouched (the backend then runs the
    float32 kernel)."""
    gen = torch.Generator().manual_seed(4)
    kv = make_paged_kv([10], 1, head_size, 16, torch.bfloat16, gen)
    q = torch.randn(10, 2, head_size, generator=gen)
    out = torch.full_like(q, 7.0)
    args = (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, query_start_loc([10]), 0.2)
    assert not ops.paged_prefill_attention_bf16(out, q, *args)
    assert torch.equal(out, torch.full_like(q, 7.0))


def test_rejects_bad_input(ops) -> None:  # type: ignore[no-untyped-def]
    """The float32 kernel's checks (`cpu_prefill_tasks.h`, tested one by one beside that kernel)
    run first, on any CPU; then a float32 cache, which this kernel does not read."""
    gen = torch.Generator().manual_seed(5)
    kv = make_paged_kv([40], 1, 64, 16, torch.bfloat16, gen)
    q = torch.randn(8, 3, 64, generator=gen)
    tables = kv.block_tables.clone()
    tables[0, 1] = kv.k_cache.shape[0]
    rest = (kv.seq_lens, query_start_loc([8]), 1.0)
    with pytest.raises(RuntimeError, match="out of range"):
        ops.paged_prefill_attention_bf16(
            torch.empty_like(q), q, kv.k_cache, kv.v_cache, tables, *rest
        )
    fp32 = (kv.k_cache.float(), kv.v_cache.float(), kv.block_tables)
    with pytest.raises(RuntimeError, match="must be BFloat16"):
        ops.paged_prefill_attention_bf16(torch.empty_like(q), q, *fp32, *rest)


@pytest.mark.slow  # the -march=haswell build takes about a minute on 2 cores the first time
def test_a_build_without_bf16_products_declines() -> None:
    avx2 = cpu_ops.load("haswell")
    assert avx2 is not None, cpu_ops.unavailable_reason("haswell")
    gen = torch.Generator().manual_seed(6)
    kv = make_paged_kv([45], 2, 64, 16, torch.bfloat16, gen)
    q = torch.randn(45, 6, 64, generator=gen)
    out = torch.full_like(q, 7.0)
    args = (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, query_start_loc([45]), 0.125)
    assert not avx2.paged_prefill_attention_bf16(out, q, *args)
    assert torch.equal(out, torch.full_like(q, 7.0))
