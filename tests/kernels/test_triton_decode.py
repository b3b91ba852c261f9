"""`kernels.triton_decode.paged_decode_attention` against the reference."""

from __future__ import annotations

import pytest
import torch
from paged_cases import DTYPES, TOLERANCE, dtype_id, make_paged_kv, on_device, rel_err

from kernels import reference
from kernels.triton_decode import choose_num_splits, paged_decode_attention, split_plan

# Not multiples of any block size, plus one long enough for many splits.
CONTEXTS = [1, 15, 17, 100, 1000]


def check_decode(
    dtype: torch.dtype,
    group: int,
    head_size: int,
    block_size: int,
    num_splits: int | None,
    contexts: list[int] = CONTEXTS,
    num_kv_heads: int = 2,
    seed: int = 0,
) -> float:
    gen = torch.Generator().manual_seed(seed)
    kv = make_paged_kv(contexts, num_kv_heads, head_size, block_size, dtype, gen)
    q = on_device(
        torch.randn(len(contexts), num_kv_heads * group, head_size, generator=gen).to(dtype)
    )
    scale = head_size**-0.5
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, scale)
    ref = reference.paged_decode_attention(*args)
    out = torch.full_like(q, float("nan"))
    paged_decode_attention(*args, max(contexts), out=out, num_splits=num_splits)
    err = rel_err(out, ref)
    assert err < TOLERANCE[dtype], f"rel err {err:.2e} (splits={num_splits})"
    return err


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize(
    ("group", "head_size", "block_size", "num_splits"),
    [(1, 64, 16, 1), (3, 80, 4, 5), (4, 128, 32, None), (8, 96, 8, 3)],
)
def test_decode_matches_reference(
    dtype: torch.dtype, group: int, head_size: int, block_size: int, num_splits: int | None
) -> None:
    check_decode(dtype, group, head_size, block_size, num_splits)


def test_decode_max_seq_len_from_device_and_upper_bound() -> None:
    gen = torch.Generator().manual_seed(3)
    kv = make_paged_kv([5, 70], 1, 64, 16, torch.float32, gen)
    q = on_device(torch.randn(2, 2, 64, generator=gen))
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 0.125)
    ref = reference.paged_decode_attention(*args)
    assert rel_err(paged_decode_attention(*args), ref) < 1e-5
    # An over-estimate only grows the grid: the extra splits are empty and get weight 0.
    assert rel_err(paged_decode_attention(*args, 4096, num_splits=8), ref) < 1e-5


@pytest.mark.parametrize(
    ("grid_max_len", "num_splits", "min_split_len"),
    [(17, 8, 64), (1000, 8, 64), (131072, 64, 64), (131072, 3, 128), (64, None, 64)],
)
def test_decode_splits_each_sequence_by_its_own_length(
    grid_max_len: int, num_splits: int | None, min_split_len: int
) -> None:
    # A CUDA graph sizes its grid once (from max_model_len, 131072 here) and replays it for
    # every context: each sequence cuts its own length into the grid's splits, so a grid sized
    # for a much longer or a much shorter sequence (17 tokens against 1000) loses nothing.
    gen = torch.Generator().manual_seed(5)
    contexts = [1000, 1, 64, 65, 300, 17]
    kv = make_paged_kv(contexts, 2, 64, 16, torch.float32, gen)
    q = on_device(torch.randn(len(contexts), 4, 64, generator=gen))
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 0.125)
    ref = reference.paged_decode_attention(*args)
    out = paged_decode_attention(
        *args, grid_max_len, num_splits=num_splits, min_split_len=min_split_len
    )
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_padding_rows_give_zeros(num_splits: int) -> None:
    # seq_len 0 marks a padding row (e.g. a CUDA-graph batch): zeros, not NaN (the reference's).
    gen = torch.Generator().manual_seed(4)
    kv = make_paged_kv([300, 1], 1, 64, 16, torch.float32, gen)
    seq_lens = on_device(torch.tensor([300, 0], dtype=torch.int32))
    q = on_device(torch.randn(2, 2, 64, generator=gen))
    out = paged_decode_attention(
        q, kv.k_cache, kv.v_cache, kv.block_tables, seq_lens, 0.125, 300, num_splits=num_splits
    )
    ref = reference.paged_decode_attention(
        q[:1], kv.k_cache, kv.v_cache, kv.block_tables[:1], seq_lens[:1], 0.125
    )
    assert rel_err(out[:1], ref) < 1e-5
    assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_split_plan() -> None:
    assert split_plan(1000, 3) == (3, 384)
    assert split_plan(1000, 5) == (4, 256)  # 5 x 200 rounds up to whole 64-token tiles
    assert split_plan(17, 8) == (1, 256)  # never under min_split_len (256 by default)
    assert split_plan(17, 8, 64) == (1, 64)
    assert split_plan(1000, 8, 128) == (8, 128)
    assert split_plan(1000, 3, 512) == (2, 512)
    with pytest.raises(ValueError, match="min_split_len must be a multiple of 64"):
        split_plan(1000, 3, 100)
    with pytest.raises(ValueError, match="num_splits must be in"):
        split_plan(1000, 65)


def test_split_heuristic() -> None:
    sms = 132
    assert choose_num_splits(1, 8, 32768, sms) == 64  # few long sequences: split hard
    assert choose_num_splits(1, 8, 300, sms) == 2  # but never below 256 tokens a split
    assert choose_num_splits(32, 8, 4096, sms) == 3
    assert choose_num_splits(256, 8, 32768, sms) == 1  # the batch alone fills the GPU


def _decode_args() -> dict[str, object]:
    return {
        "q": torch.zeros(2, 4, 64),
        "k_cache": torch.zeros(3, 2, 16, 64),
        "v_cache": torch.zeros(3, 2, 16, 64),
        "block_tables": torch.zeros(2, 3, dtype=torch.int32),
        "seq_lens": torch.ones(2, dtype=torch.int32),
        "scale": 0.125,
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"q": torch.zeros(2, 4, 64, dtype=torch.float16)}, "q dtype torch.float16 != cache"),
        ({"q": torch.zeros(2, 3, 64)}, "num_q_heads 3 is not a multiple of num_kv_heads 2"),
        ({"q": torch.zeros(2, 4, 32)}, "q head_size 32 != cache head_size 64"),
        ({"q": torch.zeros(8, 64)}, r"q must be \(tokens, num_q_heads, head_size\)"),
        ({"k_cache": torch.zeros(3, 2, 16, 64, dtype=torch.float64)}, "share one dtype"),
        ({"v_cache": torch.zeros(3, 8, 2, 64)}, "v_cache shape"),
        ({"block_tables": torch.zeros(3, 3, dtype=torch.int32)}, "block_tables must be 2-D with 2"),
        ({"seq_lens": torch.ones(2)}, "seq_lens must be int32 or int64"),
        ({"out": torch.zeros(2, 4, 64, dtype=torch.float16)}, "out must match q"),
    ],
)
def test_decode_rejects_bad_arguments(change: dict[str, object], message: str) -> None:
    args = _decode_args()
    args.update(change)
    with pytest.raises(ValueError, match=message):
        paged_decode_attention(**args)  # type: ignore[arg-type]
