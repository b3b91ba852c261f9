"""`skinny_linear` (kernels/cpu_linear.cpp) and its routing in `PackedLinear`, against F.linear."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernels import cpu_ops
from worker.models.cpu_linear import SKINNY_MAX_ROWS, PackedLinear, onednn_supports


@pytest.fixture(scope="module")
def ops() -> ModuleType:
    module = cpu_ops.load()
    assert module is not None, cpu_ops.unavailable_reason()
    return module


# Feature counts around the kernel's edges: vector tails (37, 700 = 2 x 256 + 188), one 256-float
# chunk exactly, and the model's own (576 in, 960 out; 1536 in). Output counts not a multiple of
# the 4-row weight block (7, 5, 3) exercise the narrow blocks.
SHAPES = [(37, 7), (256, 5), (700, 3), (576, 960), (1536, 576)]


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 17])
@pytest.mark.parametrize(("k", "n"), SHAPES)
def test_skinny_linear_matches_linear(ops: ModuleType, rows: int, k: int, n: int) -> None:
    gen = torch.Generator().manual_seed(rows * 1000 + k + n)
    x = torch.randn(rows, k, generator=gen)
    weight = torch.randn(n, k, generator=gen)
    bias = torch.randn(n, generator=gen)
    torch.testing.assert_close(ops.skinny_linear(x, weight), x @ weight.T, rtol=1e-4, atol=1e-4)
    got = ops.skinny_linear(x, weight, bias)
    torch.testing.assert_close(got, F.linear(x, weight, bias), rtol=1e-4, atol=1e-4)


def test_skinny_linear_takes_strided_rows(ops: ModuleType) -> None:
    # Rows of a wider buffer (a split of a fused projection): only the row stride differs.
    x = torch.randn(4, 2 * 96)[:, :96]
    weight = torch.randn(40, 96)
    assert not x.is_contiguous()
    torch.testing.assert_close(ops.skinny_linear(x, weight), x @ weight.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("x", "weight", "bias", "message"),
    [
        (torch.zeros(2, 8), torch.zeros(4, 6), None, "x has 8 features, weight expects 6"),
        (torch.zeros(2, 8, dtype=torch.float64), torch.zeros(4, 8), None, "x has dtype Double"),
        (torch.zeros(2, 8)[:, ::2], torch.zeros(4, 4), None, "x rows must be contiguous"),
        (torch.zeros(2, 8), torch.zeros(8, 4).T, None, "weight must be contiguous"),
        (torch.zeros(2, 8), torch.zeros(4, 8), torch.zeros(5), "bias must hold 4 values"),
        (torch.zeros(8), torch.zeros(4, 8), None, "x must have 2 dimensions"),
    ],
)
def test_skinny_linear_rejects_bad_arguments(
    ops: ModuleType, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, message: str
) -> None:
    with pytest.raises(RuntimeError, match=message):
        ops.skinny_linear(x, weight, bias)


class CountingOps:
    """Our module's `skinny_linear`, counting its calls."""

    def __init__(self, ops: ModuleType) -> None:
        self.ops, self.calls = ops, 0

    def skinny_linear(self, *args: torch.Tensor | None) -> torch.Tensor:
        self.calls += 1
        return self.ops.skinny_linear(*args)  # type: ignore[no-any-return]


@pytest.mark.skipif(not onednn_supports(torch.float32), reason="this torch build has no oneDNN")
@pytest.mark.parametrize("bias", [True, False])
def test_packed_linear_routes_few_rows_to_skinny(ops: ModuleType, bias: bool) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(64, 48, bias=bias)
    counting = CountingOps(ops)
    packed = PackedLinear(linear, skinny_ops=counting)  # type: ignore[arg-type]
    for rows, skinny in [(1, True), (SKINNY_MAX_ROWS, True), (SKINNY_MAX_ROWS + 1, False)]:
        before = counting.calls
        x = torch.randn(rows, 64)
        torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
        assert (counting.calls - before == 1) is skinny, rows
    # 3-D inputs and strided columns stay on oneDNN; without ops, nothing keeps the plain weight.
    for x in (torch.randn(1, 2, 64), torch.randn(2, 128)[:, ::2]):
        before = counting.calls
        torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
        assert counting.calls == before
    assert PackedLinear(linear).weight is None
