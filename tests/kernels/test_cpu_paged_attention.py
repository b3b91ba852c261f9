"""`kernels/cpu_paged_attention.cpp` (our C++ CPU decode kernel) against the reference.

The kernel is compiled on first use (about 40 s on 2 cores, then cached); CI has a compiler and
ninja, so a build failure fails here instead of silently falling back to torch.
"""

from __future__ import annotations

import pytest
import torch
from paged_cases import TOLERANCE, dtype_id, make_paged_kv, rel_err

from kernels import cpu_ops, reference
from worker.attention import AttentionMetadata, KVCache
from worker.attention.backend import get_attention_backend
from worker.attention.cpu_backend import CpuAttentionBackend


@pytest.fixture(scope="module")
def ops():  # type: ignore[no-untyped-def]
    module = cpu_ops.load()
    assert module is not None, cpu_ops.unavailable_reason()
    return module


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize(
    ("group", "head_size", "block_size", "num_kv_heads"),
    [(3, 64, 16, 3), (1, 64, 16, 2), (4, 128, 32, 2), (2, 80, 1, 1), (8, 32, 16, 1)],
)
def test_decode_matches_reference(  # type: ignore[no-untyped-def]
    ops, group: int, head_size: int, block_size: int, num_kv_heads: int, cache_dtype: torch.dtype
) -> None:
    """float32 queries over a float32 or bf16 cache: the reference widens a bf16 cache to
    float32 before its matmuls, the kernel as it reads, so both tolerances are float32's."""
    gen = torch.Generator().manual_seed(group * 1000 + head_size)
    # Not multiples of the block size, one token, and one long enough for many blocks; the
    # cache's unowned slots hold POISON, so reading past a length shows up as a huge error.
    contexts = [1, 15, 17, 100, 1000, 33]
    kv = make_paged_kv(contexts, num_kv_heads, head_size, block_size, cache_dtype, gen)
    q = torch.randn(len(contexts), num_kv_heads * group, head_size, generator=gen)
    scale = head_size**-0.5
    ref = reference.paged_decode_attention(
        q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, scale
    )
    out = torch.full_like(q, float("nan"))
    ops.paged_decode_attention(out, q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, scale)
    assert rel_err(out, ref) < TOLERANCE[torch.float32]


@pytest.mark.parametrize("num_kv_heads", [1, 3])
def test_the_output_is_the_same_on_any_number_of_threads(ops, num_kv_heads: int) -> None:  # type: ignore[no-untyped-def]
    """Threads take whole sequences, or one head of a sequence that outweighs a thread's share
    (the 1,200-token one at 2+ threads), longest first: which thread takes what must not change
    a bit of the output, and every head must be computed once."""
    gen = torch.Generator().manual_seed(7)
    contexts = [40, 1200, 300, 300, 300, 5, 64, 300]
    kv = make_paged_kv(contexts, num_kv_heads, 64, 16, torch.float32, gen)
    q = torch.randn(len(contexts), num_kv_heads * 3, 64, generator=gen)
    args = (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 0.125)
    ref = reference.paged_decode_attention(q, *args)
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2, 3, 8):
            torch.set_num_threads(threads)
            out = torch.full_like(q, float("nan"))
            ops.paged_decode_attention(out, q, *args)
            outs.append(out)
    finally:
        torch.set_num_threads(before)
    assert rel_err(outs[0], ref) < TOLERANCE[torch.float32]
    for out in outs[1:]:
        assert torch.equal(out, outs[0])


def test_rejects_bad_input(ops) -> None:  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(0)
    kv = make_paged_kv([20, 5], 1, 64, 16, torch.float32, gen)
    q = torch.randn(2, 2, 64, generator=gen)
    out = torch.empty_like(q)
    args = (kv.k_cache, kv.v_cache, kv.block_tables)
    with pytest.raises(RuntimeError, match="outside its block table"):
        ops.paged_decode_attention(out, q, *args, torch.tensor([20, 500], dtype=torch.int32), 1.0)
    bad_tables = kv.block_tables.clone()
    bad_tables[0, 1] = 10_000
    with pytest.raises(RuntimeError, match="out of range"):
        ops.paged_decode_attention(out, q, kv.k_cache, kv.v_cache, bad_tables, kv.seq_lens, 1.0)
    with pytest.raises(RuntimeError, match="dtype"):
        ops.paged_decode_attention(out, q.double(), *args, kv.seq_lens, 1.0)
    half = kv.k_cache.half(), kv.v_cache.half()  # a cache dtype the kernel does not read
    with pytest.raises(RuntimeError, match="expected Float or BFloat16"):
        ops.paged_decode_attention(out, q, *half, kv.block_tables, kv.seq_lens, 1.0)
    with pytest.raises(RuntimeError, match="v_cache has dtype"):
        ops.paged_decode_attention(out, q, kv.k_cache, half[1], kv.block_tables, kv.seq_lens, 1.0)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_backend_decodes_and_prefills_like_torch(  # type: ignore[no-untyped-def]
    ops, cache_dtype: torch.dtype
) -> None:
    """A mixed step (2 decodes, then a prefill chunk) through the `cpu` backend equals `torch`."""
    gen = torch.Generator().manual_seed(1)
    contexts = [40, 9, 30]  # the last is a 12-token chunk ending at 30
    kv = make_paged_kv(contexts, 3, 64, 16, cache_dtype, gen)
    q = torch.randn(1 + 1 + 12, 9, 64, generator=gen)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(0, dtype=torch.int64),
        block_tables=kv.block_tables,
        seq_lens=kv.seq_lens,
        query_start_loc=torch.tensor([0, 1, 2, 14], dtype=torch.int32),
        num_decodes=2,
        max_seq_len=40,
        max_query_len=12,
        seq_lens_host=tuple(contexts),
    )
    backend = get_attention_backend("auto", torch.device("cpu"))
    assert isinstance(backend, CpuAttentionBackend)
    backend.bf16_prefill = False  # prefill as torch's, in float32 (bf16: the test below)
    torch_backend = get_attention_backend("torch", torch.device("cpu"))
    ours = backend.attend(q, KVCache(kv.k_cache, kv.v_cache), meta, 0.125)
    expected = torch_backend.attend(q, KVCache(kv.k_cache, kv.v_cache), meta, 0.125)
    assert rel_err(ours, expected) < TOLERANCE[torch.float32]


@pytest.mark.parametrize("bf16_prefill", [False, True])
def test_prefill_over_a_bf16_cache_attends_in_bf16_where_asked(  # type: ignore[no-untyped-def]
    ops, bf16_prefill: bool
) -> None:
    """`CpuAttentionBackend.bf16_prefill` (AMX or AVX-512 BF16): prefill chunks over a bf16
    cache in bf16 (`cpu_prefill_bf16.cpp` where the CPU has either, else SDPA's bf16; within
    bf16's tolerance of float32), or
    else in float32 through our kernel, which widens the cache (float32's tolerance of the
    reference); a float32 cache stays float32 either way."""
    gen = torch.Generator().manual_seed(2)
    contexts = [30, 17]  # chunks of 12 and 17 tokens
    kv = make_paged_kv(contexts, 3, 64, 16, torch.bfloat16, gen)
    q = torch.randn(12 + 17, 9, 64, generator=gen)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(0, dtype=torch.int64),
        block_tables=kv.block_tables,
        seq_lens=kv.seq_lens,
        query_start_loc=torch.tensor([0, 12, 29], dtype=torch.int32),
        num_decodes=0,
        max_seq_len=30,
        max_query_len=17,
        seq_lens_host=tuple(contexts),
    )
    backend = CpuAttentionBackend(ops)
    backend.bf16_prefill = bf16_prefill
    exact = reference.paged_prefill_attention(
        q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, meta.query_start_loc, 0.125
    )
    out = backend.attend(q, KVCache(kv.k_cache, kv.v_cache), meta, 0.125)
    assert out.dtype == torch.float32
    if bf16_prefill:
        assert not torch.equal(out, exact)
        assert rel_err(out, exact) < TOLERANCE[torch.bfloat16]
    else:
        assert rel_err(out, exact) < TOLERANCE[torch.float32]
    fp32 = KVCache(kv.k_cache.float(), kv.v_cache.float())
    assert rel_err(backend.attend(q, fp32, meta, 0.125), exact) < TOLERANCE[torch.float32]


@pytest.mark.slow  # the -march=haswell build takes about a minute on 2 cores the first time
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_the_avx2_build_decodes_like_the_reference(cache_dtype: torch.dtype) -> None:
    """The AVX2 vectors of `cpu_attention_vec.h` (8 lanes), which an AVX-512 machine's own build
    does not run: 3 and 8 query heads a KV head, heads of 64 and 32."""
    avx2 = cpu_ops.load("haswell")
    assert avx2 is not None, cpu_ops.unavailable_reason("haswell")
    gen = torch.Generator().manual_seed(7)
    for group, head_size in ((3, 64), (8, 32)):
        kv = make_paged_kv([1, 17, 300, 33], 2, head_size, 16, cache_dtype, gen)
        q = torch.randn(4, 2 * group, head_size, generator=gen)
        args = (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, head_size**-0.5)
        out = torch.full_like(q, float("nan"))
        avx2.paged_decode_attention(out, q, *args)
        assert rel_err(out, reference.paged_decode_attention(q, *args)) < TOLERANCE[torch.float32]
