"""`kernels.triton_prefill.paged_prefill_attention` against the reference."""

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

from kernels import reference
from kernels.triton_prefill import paged_prefill_attention

# (context length, new tokens): a fresh prompt, decodes (q_len 1), chunks on a cached prefix of
# odd lengths, and one chunk longer than a 64-row query tile on a 930-token prefix.
MIXED_BATCH = [(17, 17), (15, 1), (100, 37), (1, 1), (1000, 70), (33, 16)]


def check_prefill(
    dtype: torch.dtype,
    group: int,
    head_size: int,
    block_size: int,
    batch: list[tuple[int, int]] = MIXED_BATCH,
    num_kv_heads: int = 2,
    seed: int = 0,
) -> float:
    gen = torch.Generator().manual_seed(seed)
    contexts = [ctx for ctx, _ in batch]
    q_lens = [q_len for _, q_len in batch]
    kv = make_paged_kv(contexts, num_kv_heads, head_size, block_size, dtype, gen)
    q = on_device(
        torch.randn(sum(q_lens), num_kv_heads * group, head_size, generator=gen).to(dtype)
    )
    qsl = query_start_loc(q_lens)
    scale = head_size**-0.5
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, qsl, scale)
    ref = reference.paged_prefill_attention(*args)
    out = torch.full_like(q, float("nan"))
    paged_prefill_attention(*args, max(q_lens), out=out)
    err = rel_err(out, ref)
    assert err < TOLERANCE[dtype], f"rel err {err:.2e}"
    return err


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize(
    ("group", "head_size", "block_size"), [(1, 64, 16), (4, 80, 4), (3, 128, 32)]
)
def test_prefill_matches_reference(
    dtype: torch.dtype, group: int, head_size: int, block_size: int
) -> None:
    check_prefill(dtype, group, head_size, block_size)


def test_prefill_max_query_len_from_device() -> None:
    gen = torch.Generator().manual_seed(5)
    kv = make_paged_kv([9, 40], 1, 64, 8, torch.float32, gen)
    q = on_device(torch.randn(3 + 40, 2, 64, generator=gen))
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, query_start_loc([3, 40]))
    ref = reference.paged_prefill_attention(*args, 0.125)
    assert rel_err(paged_prefill_attention(*args, 0.125), ref) < 1e-5


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"query_start_loc": torch.zeros(2, dtype=torch.int32)}, "query_start_loc must be 1-D"),
        ({"seq_lens": torch.ones(2, 1, dtype=torch.int32)}, r"seq_lens must be 1-D \(num_seqs,\)"),
        ({"block_tables": torch.zeros(2, dtype=torch.int32)}, "block_tables must be 2-D"),
        ({"q": torch.zeros(5, 4, 128)[:, :, ::2]}, "unit stride on head_size"),
    ],
)
def test_prefill_rejects_bad_arguments(change: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "q": torch.zeros(5, 4, 64),
        "k_cache": torch.zeros(3, 2, 16, 64),
        "v_cache": torch.zeros(3, 2, 16, 64),
        "block_tables": torch.zeros(2, 3, dtype=torch.int32),
        "seq_lens": torch.ones(2, dtype=torch.int32),
        "query_start_loc": torch.tensor([0, 2, 5], dtype=torch.int32),
        "scale": 0.125,
    }
    args.update(change)
    with pytest.raises(ValueError, match=message):
        paged_prefill_attention(**args)  # type: ignore[arg-type]
