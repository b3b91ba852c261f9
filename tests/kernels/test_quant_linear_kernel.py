"""`gguf_linear`, `gguf_dequantize` and `int8_linear` (kernels/cpu_quant_linear.cpp) against the
torch references in kernels/quant_reference.py, over odd shapes.

Every test runs twice: on the build for this machine and on one made with ``-march=haswell``
(`cpu_ops.load("haswell")`), which compiles the AVX2 code paths (kernels/cpu_gguf_avx2.cpp:
registers for up to 15 rows, 4 at a time; the fp32 tile of 3 weight rows from 16) even on an
AVX-512 machine, whose own build runs registers below 16 rows (10 for 4-bit blocks) and a tile
of 4 weight rows from there (kernels/cpu_gguf_tile.h). That second build is a module of its own,
about a minute on 2 cores the first time, so its cases are marked slow."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from kernels import cpu_ops
from kernels import quant_reference as qr

gguf = pytest.importorskip("gguf")
from gguf.quants import quantize  # noqa: E402

# The machine's own build, and the AVX2 one.
ISAS = ["native", pytest.param("haswell", marks=pytest.mark.slow)]


@pytest.fixture(scope="module", params=ISAS)
def ops(request: pytest.FixtureRequest) -> ModuleType:
    module = cpu_ops.load(request.param)
    assert module is not None, cpu_ops.unavailable_reason(request.param)
    if request.param == "haswell":
        assert module.quant_isa() == "avx2"
    return module


def test_the_haswell_build_is_a_module_of_its_own() -> None:
    assert cpu_ops.module_name("haswell") != cpu_ops.module_name()
    assert cpu_ops.module_name() == cpu_ops.module_name(cpu_ops.NATIVE)


def random_blocks(fmt: qr.BlockFormat, n: int, k: int, seed: int) -> torch.Tensor:
    weights = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    blocks = quantize(weights.numpy(), gguf.GGMLQuantizationType(fmt.type_id))
    return torch.from_numpy(blocks)


# k: one block, 3 and 5 blocks (not a multiple of any vector or tile width), the model's 576.
# n: counts that leave 1 or 2 weight rows after the groups of 2 (AVX2's registers) or 3 (AVX-512's
# registers, AVX2's tile), and 1-3 after the groups of 4 (AVX-512's tile). Rows: every path of
# both builds, the registers below 16 (10 for AVX-512's 4-bit blocks) and the tiles from there,
# in passes of 4 (AVX2) with 0-3 rows left over and of 6 (AVX-512's tile) with 0-5.
SHAPES = [(32, 1), (64, 2), (96, 7), (160, 33), (576, 65)]
ROWS = [1, 2, 3, 5, 8, 10, 11, 13, 16, 17, 18, 19, 20, 21, 64]


def test_bf16_dequantize_converts_non_finite_scales_as_torch_does(ops: ModuleType) -> None:
    """A block whose fp16 scale is NaN or infinite (a damaged file) dequantizes to NaN or
    infinities, and the bf16 weight keeps them where torch's `.to(torch.bfloat16)` does (a NaN's
    sign and payload are not compared: torch's own scalar and vector paths differ there). Without
    the NaN case the rounding carry turned a NaN such as 0x7FFFFFFF into -0."""
    blocks = random_blocks(qr.Q8_0, 3, 64, seed=5)
    scales = blocks.view(torch.uint8)[:, [0, 1]]  # block 0's fp16 d, little-endian
    scales[0] = torch.tensor([0x00, 0x7E], dtype=torch.uint8)  # NaN
    scales[1] = torch.tensor([0x00, 0x7C], dtype=torch.uint8)  # +inf: inf and NaN (q = 0)
    blocks[:, :2] = scales
    w = qr.dequantize(blocks, qr.Q8_0.type_id)
    assert w[:2, :32].isfinite().logical_not().all()
    got = ops.gguf_dequantize(blocks, qr.Q8_0.type_id, bf16=True)
    expected = w.to(torch.bfloat16)
    assert got[:2, :32].isfinite().logical_not().all()
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("fmt", [qr.Q4_0, qr.Q4_1, qr.Q8_0])
@pytest.mark.parametrize(("k", "n"), SHAPES)
def test_gguf_linear_matches_reference(
    ops: ModuleType, fmt: qr.BlockFormat, k: int, n: int
) -> None:
    blocks = random_blocks(fmt, n, k, seed=k + n)
    w = qr.dequantize(blocks, fmt.type_id)
    assert torch.equal(ops.gguf_dequantize(blocks, fmt.type_id), w)
    # bf16 straight from the blocks: torch's own rounding of the fp32 weight, bit for bit.
    assert torch.equal(ops.gguf_dequantize(blocks, fmt.type_id, bf16=True), w.to(torch.bfloat16))
    bias = torch.randn(n)
    for rows in ROWS:
        x = torch.randn(rows, k)
        expected = qr.quant_linear(x, blocks, fmt.type_id, bias)
        got = ops.gguf_linear(x, blocks, fmt.type_id, bias)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    for rows in (3, 17):  # strided rows (a split of a fused projection), registers and tile
        x = torch.randn(rows, 2 * k)[:, :k]
        torch.testing.assert_close(
            ops.gguf_linear(x, blocks, fmt.type_id),
            qr.quant_linear(x, blocks, fmt.type_id),
            rtol=1e-4,
            atol=1e-4,
        )


@pytest.mark.parametrize(("k", "n"), [(1, 1), (15, 3), (77, 9), (576, 65)])
def test_int8_linear_matches_reference(ops: ModuleType, k: int, n: int) -> None:
    q, scale = qr.quantize_int8(torch.randn(n, k))
    bias = torch.randn(n)
    for rows in ROWS:
        x = torch.randn(rows, k)
        torch.testing.assert_close(
            ops.int8_linear(x, q, scale, bias),
            qr.int8_linear(x, q, scale, bias),
            rtol=1e-4,
            atol=1e-4,
        )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda o: o.gguf_linear(torch.zeros(2, 64), torch.zeros(3, 40, dtype=torch.uint8), 12),
            "GGML type 12 has no kernel",
        ),
        (
            lambda o: o.gguf_linear(torch.zeros(2, 64), torch.zeros(3, 30, dtype=torch.uint8), 3),
            "whole 20-byte blocks",
        ),
        (
            lambda o: o.gguf_linear(torch.zeros(2, 32), torch.zeros(3, 40, dtype=torch.uint8), 3),
            "x has 32 features, weight expects 64",
        ),
        (lambda o: o.gguf_linear(torch.zeros(2, 64), torch.zeros(3, 40), 3), "blocks has dtype"),
        (
            lambda o: o.int8_linear(
                torch.zeros(2, 8), torch.zeros(4, 8, dtype=torch.int8), torch.ones(3)
            ),
            "scale must hold 4 values",
        ),
    ],
)
def test_bad_arguments_raise(ops: ModuleType, call: object, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        call(ops)  # type: ignore[operator]
