"""The full interpreter sweep: every head size x dtype x block size, for decode and prefill.

Marked slow (about 2 minutes on 2 cores); run with ``pytest tests/kernels -m slow``.
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
IDS = [
    f"D{d}-{dtype_id(t)}-bs{b}" for d, t, b in itertools.product(HEAD_SIZES, DTYPES, BLOCK_SIZES)
]
# The GQA ratio follows the block size, so every ratio meets every head size and dtype.
GROUP_FOR_BLOCK = {4: 3, 8: 8, 16: 1, 32: 4}
CASES = list(itertools.product(HEAD_SIZES, DTYPES, BLOCK_SIZES))


@pytest.mark.slow
@pytest.mark.parametrize(("head_size", "dtype", "block_size"), CASES, ids=IDS)
def test_decode_sweep(head_size: int, dtype: torch.dtype, block_size: int) -> None:
    seed = CASES.index((head_size, dtype, block_size))
    group = GROUP_FOR_BLOCK[block_size]
    for num_splits in (None, 1 + seed % 7):
        check_decode(dtype, group, head_size, block_size, num_splits, seed=seed)


@pytest.mark.slow
@pytest.mark.parametrize(("head_size", "dtype", "block_size"), CASES, ids=IDS)
def test_prefill_sweep(head_size: int, dtype: torch.dtype, block_size: int) -> None:
    seed = CASES.index((head_size, dtype, block_size))
    check_prefill(dtype, GROUP_FOR_BLOCK[block_size], head_size, block_size, seed=seed)
