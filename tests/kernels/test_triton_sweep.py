"""The interpreter sweep over head sizes, dtypes and block sizes, for decode and prefill.

Every pair of values (head size and dtype, head size and block size, dtype and block size)
meets in at least one case: 16 cases instead of the full product's 48, which were the largest
share of CI's time. Each case keeps its seed from the full product.
Marked slow; run with ``pytest tests/kernels -m slow``.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from paged_cases import dtype_id
from test_triton_decode import check_decode
from test_triton_prefill import check_prefill

HEAD_SIZES = [64, 80, 96, 128]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
BLOCK_SIZES = [4, 8, 16, 32]
# The GQA ratio follows the block size, so every ratio meets every head size and dtype.
GROUP_FOR_BLOCK = {4: 3, 8: 8, 16: 1, 32: 4}
FULL = list(itertools.product(HEAD_SIZES, DTYPES, BLOCK_SIZES))
# A Latin square: head i and block j take dtype (i + j) mod 3, so each head and each block size
# meets all three dtypes across its four cases.
CASES = [
    (d, DTYPES[(i + j) % len(DTYPES)], b)
    for i, d in enumerate(HEAD_SIZES)
    for j, b in enumerate(BLOCK_SIZES)
]
IDS = [f"D{d}-{dtype_id(t)}-bs{b}" for d, t, b in CASES]


def test_cases_cover_every_pair() -> None:
    pairs = (
        {(d, t) for d, t, _ in CASES},
        {(d, b) for d, _, b in CASES},
        {(t, b) for _, t, b in CASES},
    )
    assert len(pairs[0]) == len(HEAD_SIZES) * len(DTYPES)
    assert len(pairs[1]) == len(HEAD_SIZES) * len(BLOCK_SIZES)
    assert len(pairs[2]) == len(DTYPES) * len(BLOCK_SIZES)


@pytest.mark.slow
@pytest.mark.parametrize(("head_size", "dtype", "block_size"), CASES, ids=IDS)
def test_decode_sweep(head_size: int, dtype: torch.dtype, block_size: int) -> None:
    seed = FULL.index((head_size, dtype, block_size))
    group = GROUP_FOR_BLOCK[block_size]
    for num_splits in (None, 1 + seed % 7):
        check_decode(dtype, group, head_size, block_size, num_splits, seed=seed)


@pytest.mark.slow
@pytest.mark.parametrize(("head_size", "dtype", "block_size"), CASES, ids=IDS)
def test_prefill_sweep(head_size: int, dtype: torch.dtype, block_size: int) -> None:
    seed = FULL.index((head_size, dtype, block_size))
    check_prefill(dtype, GROUP_FOR_BLOCK[block_size], head_size, block_size, seed=seed)
