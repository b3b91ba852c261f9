"""`TritonAttentionBackend` against `TorchAttentionBackend` on the same metadata and caches."""

from __future__ import annotations

import pytest
import torch
from paged_cases import (
    DTYPES,
    TOLERANCE,
    dtype_id,
    make_paged_kv,
    on_device,
    query_start_loc,
    rel_err,
)

from worker.attention.backend import get_attention_backend
from worker.attention.metadata import AttentionMetadata, KVCache
from worker.attention.torch_backend import TorchAttentionBackend
from worker.attention.triton_backend import TritonAttentionBackend

# (context length, new tokens); the runner puts decodes (1 new token) first.
MIXED = [(1, 1), (17, 1), (300, 1), (40, 40), (100, 30), (16, 1)]
ALL_DECODES = [(5, 1), (64, 1), (129, 1)]
ALL_PREFILL = [(20, 20), (90, 7)]


def run_step(batch: list[tuple[int, int]], num_decodes: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    num_kv_heads, group, head_size, block_size = 2, 4, 64, 16
    contexts = [ctx for ctx, _ in batch]
    q_lens = [q_len for _, q_len in batch]
    # The cached prefix holds K/V already; this step's slots hold poison until written.
    kv = make_paged_kv(
        contexts,
        num_kv_heads,
        head_size,
        block_size,
        dtype,
        gen,
        fill_to=[ctx - q_len for ctx, q_len in batch],
    )
    meta = AttentionMetadata(
        slot_mapping=torch.cat([kv.slots(b, c - n, c) for b, (c, n) in enumerate(batch)]),
        block_tables=kv.block_tables,
        seq_lens=kv.seq_lens,
        query_start_loc=query_start_loc(q_lens),
        num_decodes=num_decodes,
        max_seq_len=max(contexts),
        max_query_len=max(q_lens),
    )
    num_tokens = sum(q_lens)
    q, key, value = (
        on_device(torch.randn(num_tokens, heads, head_size, generator=gen).to(dtype))
        for heads in (num_kv_heads * group, num_kv_heads, num_kv_heads)
    )
    k_ref, v_ref = kv.k_cache.clone(), kv.v_cache.clone()
    ref = TorchAttentionBackend().forward(q, key, value, KVCache(k_ref, v_ref), meta, 0.125)
    cache = KVCache(kv.k_cache, kv.v_cache)
    out = TritonAttentionBackend().forward(q, key, value, cache, meta, 0.125)
    torch.testing.assert_close(kv.k_cache, k_ref, rtol=0, atol=0)
    torch.testing.assert_close(kv.v_cache, v_ref, rtol=0, atol=0)
    err = rel_err(out, ref)
    assert err < TOLERANCE[dtype], f"rel err {err:.2e}"


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_mixed_batch_matches_torch_backend(dtype: torch.dtype) -> None:
    run_step(MIXED, num_decodes=3, dtype=dtype)


def test_all_decodes_matches_torch_backend() -> None:
    run_step(ALL_DECODES, num_decodes=len(ALL_DECODES), dtype=torch.float32)


def test_all_prefill_matches_torch_backend() -> None:
    run_step(ALL_PREFILL, num_decodes=0, dtype=torch.float32)


def test_factory_builds_triton_backend() -> None:
    backend = get_attention_backend("triton", torch.device("cpu"))
    assert isinstance(backend, TritonAttentionBackend)
    assert backend.name == "triton"
