"""`kernels/cpu_prefill_attention.cpp` (our C++ CPU prefill kernel) against the reference.

The reference (`kernels.reference.paged_prefill_attention`) gathers each sequence's blocks and
runs SDPA; the kernel reads them where they lie with an online softmax, so the two agree to
float32's tolerance, not bit for bit. Unowned cache slots hold `paged_cases.POISON`: a read
past a context, or of a key after a query's own position, misses the tolerance by far.
"""

from __future__ import annotations

import pytest
import torch
from paged_cases import (
    TOLERANCE,
    cpu_has,
    dtype_id,
    make_paged_kv,
    prefill_kernel_error,
    query_start_loc,
    rel_err,
)

from kernels import cpu_ops, reference
from worker.attention import AttentionMetadata, KVCache
from worker.attention.cpu_backend import CpuAttentionBackend


@pytest.fixture(scope="module")
def ops():  # type: ignore[no-untyped-def]
    module = cpu_ops.load()
    assert module is not None, cpu_ops.unavailable_reason()
    if not cpu_has("avx512f"):
        pytest.skip("the kernel is built for AVX-512 only; AVX2 builds keep SDPA (tested below)")
    return module


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize(
    ("group", "head_size", "block_size", "num_kv_heads"),
    [(3, 64, 16, 3), (1, 64, 16, 2), (4, 128, 32, 2), (2, 80, 1, 1), (8, 32, 16, 1), (3, 64, 7, 1)],
)
def test_prefill_matches_reference(  # type: ignore[no-untyped-def]
    ops, group: int, head_size: int, block_size: int, num_kv_heads: int, cache_dtype: torch.dtype
) -> None:
    """Fresh prompts (queries = context) and chunks after earlier tokens, of lengths that are
    not multiples of the block, of a 64-key chunk or of a 32-token tile; one query alone. A
    bf16 cache is widened as it is read, as the reference widens it: float32's tolerance."""
    contexts = [1, 17, 100, 300, 95, 64, 33]
    q_lens = [1, 17, 37, 300, 1, 64, 5]
    kernel = ops.paged_prefill_attention
    error = prefill_kernel_error(
        kernel, contexts, q_lens, group, head_size, block_size, num_kv_heads, 0, cache_dtype
    )
    assert error < TOLERANCE[torch.float32]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_long_chunks_on_any_number_of_threads(ops, threads: int) -> None:  # type: ignore[no-untyped-def]
    """A 512-token chunk over 1,100 tokens beside a fresh 200-token prompt, tiles taken
    costliest first by whichever thread is free."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kernel = ops.paged_prefill_attention
        error = prefill_kernel_error(kernel, [1100, 200], [512, 200], 3, 64, seed=threads)
    finally:
        torch.set_num_threads(before)
    assert error < TOLERANCE[torch.float32]


def test_query_rows_may_be_strided(ops) -> None:  # type: ignore[no-untyped-def]
    """q as the engine hands it over, a view into the fused qkv projection (rows 15 heads
    apart), and ``out`` with strided rows as well."""
    gen = torch.Generator().manual_seed(8)
    kv = make_paged_kv([90, 40], 3, 64, 16, torch.float32, gen)
    qkv = torch.randn(60 + 40, 9 + 2 * 3, 64, generator=gen)
    q = qkv[:, :9]
    starts = query_start_loc([60, 40])
    args = (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, starts, 0.125)
    out = torch.full((100, 12, 64), float("nan"))[:, :9]
    assert ops.paged_prefill_attention(out, q, *args)
    ref = reference.paged_prefill_attention(q.contiguous(), *args)
    assert rel_err(out, ref) < TOLERANCE[torch.float32]


def test_a_step_without_queries_writes_nothing(ops) -> None:  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(3)
    kv = make_paged_kv([20], 1, 64, 16, torch.float32, gen)
    q = torch.zeros(0, 3, 64)
    out = torch.zeros(0, 3, 64)
    args = (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, query_start_loc([0]), 0.125)
    assert ops.paged_prefill_attention(out, q, *args)


def test_a_head_size_off_the_vector_is_left_to_the_caller(ops) -> None:  # type: ignore[no-untyped-def]
    """False, with ``out`` untouched: the backend then runs SDPA."""
    gen = torch.Generator().manual_seed(4)
    kv = make_paged_kv([10], 1, 20, 16, torch.float32, gen)
    q = torch.randn(10, 2, 20, generator=gen)
    out = torch.full_like(q, 7.0)
    args = (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, query_start_loc([10]), 0.2)
    assert not ops.paged_prefill_attention(out, q, *args)
    assert torch.equal(out, torch.full_like(q, 7.0))


def test_rejects_bad_input(ops) -> None:  # type: ignore[no-untyped-def]
    """Clear errors, not reads outside the cache: a block id past the pool, more queries than
    context, caches of two dtypes, a scale that is not positive."""
    gen = torch.Generator().manual_seed(5)
    kv = make_paged_kv([40], 1, 64, 16, torch.float32, gen)
    q = torch.randn(8, 3, 64, generator=gen)
    out = torch.empty_like(q)
    starts = query_start_loc([8])
    tables = kv.block_tables.clone()
    tables[0, 1] = kv.k_cache.shape[0]
    with pytest.raises(RuntimeError, match="out of range"):
        ops.paged_prefill_attention(
            out, q, kv.k_cache, kv.v_cache, tables, kv.seq_lens, starts, 1.0
        )
    short = torch.tensor([5], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="queries for a context"):
        ops.paged_prefill_attention(
            out, q, kv.k_cache, kv.v_cache, kv.block_tables, short, starts, 1.0
        )
    half = kv.k_cache.bfloat16()
    with pytest.raises(RuntimeError, match="v_cache has dtype"):
        ops.paged_prefill_attention(
            out, q, half, kv.v_cache, kv.block_tables, kv.seq_lens, starts, 1.0
        )
    with pytest.raises(RuntimeError, match="scale must be positive"):
        ops.paged_prefill_attention(
            out, q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, starts, 0.0
        )


@pytest.mark.slow  # the -march=haswell build takes about a minute on 2 cores the first time
def test_an_avx2_build_leaves_prefill_to_sdpa() -> None:
    """Without AVX-512 the kernel declines (False, ``out`` untouched), and the backend's
    prefill is then the reference's, bit for bit."""
    avx2 = cpu_ops.load("haswell")
    assert avx2 is not None, cpu_ops.unavailable_reason("haswell")
    gen = torch.Generator().manual_seed(6)
    kv = make_paged_kv([45, 70], 2, 64, 16, torch.float32, gen)
    q = torch.randn(45 + 33, 6, 64, generator=gen)
    starts = query_start_loc([45, 33])
    args = (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, starts, 0.125)
    out = torch.full_like(q, 7.0)
    assert not avx2.paged_prefill_attention(out, q, *args)
    assert torch.equal(out, torch.full_like(q, 7.0))
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(0, dtype=torch.int64),
        block_tables=kv.block_tables,
        seq_lens=kv.seq_lens,
        query_start_loc=starts,
        num_decodes=0,
        max_seq_len=70,
        max_query_len=45,
        seq_lens_host=(45, 70),
    )
    backend = CpuAttentionBackend(avx2)
    attended = backend.attend(q, KVCache(kv.k_cache, kv.v_cache), meta, 0.125)
    assert torch.equal(attended, reference.paged_prefill_attention(q, *args))
