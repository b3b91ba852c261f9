"""`gguf_linear_q8` (kernels/cpu_gguf_q8.cpp): GGUF blocks times x rounded to 8 bits a block,
against `quant_linear_q8` in kernels/quant_reference.py, over odd shapes, on this machine's build
and on the ``-march=haswell`` one (its AVX2 path: maddubs instead of VNNI, one block a step)."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from kernels import quant_reference as qr
from tests.kernels.test_quant_linear_kernel import ROWS, SHAPES, ops, random_blocks

__all__ = ["ops"]  # the fixture, over both builds
FORMATS = [qr.Q4_0, qr.Q4_1, qr.Q8_0]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("k", "n"), SHAPES)
def test_gguf_linear_q8_matches_reference(
    ops: ModuleType, fmt: qr.BlockFormat, k: int, n: int
) -> None:
    """k of 1, 3 and 5 blocks: an odd count leaves AVX-512's last step half empty."""
    blocks = random_blocks(fmt, n, k, seed=k + n)
    bias = torch.randn(n)
    gen = torch.Generator().manual_seed(k)
    for rows in ROWS:
        x = torch.randn(rows, k, generator=gen) * 4
        x[0, :32] = 0.0  # an all-zero block: dx 0, no division by it
        expected = qr.quant_linear_q8(x, blocks, fmt.type_id, bias)
        got = ops.gguf_linear_q8(x, blocks, fmt.type_id, bias)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    x = torch.randn(3, 2 * k, generator=gen)[:, :k]  # strided rows (a split of a fused projection)
    torch.testing.assert_close(
        ops.gguf_linear_q8(x, blocks, fmt.type_id),
        qr.quant_linear_q8(x, blocks, fmt.type_id),
        rtol=1e-4,
        atol=1e-4,
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_extreme_codes_do_not_saturate(ops: ModuleType, fmt: qr.BlockFormat) -> None:
    """Every weight code at its end of the range times x at +-127: AVX2's maddubs saturates a
    pair's sum at 32,767, which Q8_0's 8-bit codes would pass unless their sign moves onto x."""
    n, k = 5, 64
    bb = fmt.block_bytes
    blocks = torch.zeros(n, k // 32 * bb, dtype=torch.uint8).view(n, k // 32, bb)
    blocks[..., 0:2] = torch.tensor([0x00, 0x3C], dtype=torch.uint8)  # d = 1.0 (fp16 0x3C00)
    if fmt is qr.Q8_0:
        blocks[:3, :, 2:] = 0x80  # -128
        blocks[3:, :, 2:] = 0x7F  # 127
    else:
        blocks[..., bb - 16 :] = 0xFF  # every nibble 15
    blocks = blocks.reshape(n, -1)
    x = torch.full((2, k), 3.0)
    x[1] = -3.0
    expected = qr.quant_linear_q8(x, blocks, fmt.type_id)
    torch.testing.assert_close(ops.gguf_linear_q8(x, blocks, fmt.type_id), expected)
    # and the reference is the exact product of the rounded x (here x is rounded exactly)
    torch.testing.assert_close(expected, qr.quant_linear(x, blocks, fmt.type_id))


def test_the_reference_is_the_exact_product_of_the_rounded_activations() -> None:
    """`quant_linear_q8` = dequantized weights times dx * a, computed another way."""
    for fmt in FORMATS:
        blocks = random_blocks(fmt, 9, 96, seed=3)
        x = torch.randn(4, 96)
        a, dx = qr.quantize_activations(x)
        assert float(a.abs().max()) == 127.0 and torch.all(a == a.round())
        assert float((a * dx[..., None]).reshape(4, 96).sub(x).abs().max()) <= float(dx.max())
        rounded = (a * dx[..., None]).reshape(4, 96).double()
        exact = rounded @ qr.dequantize(blocks, fmt.type_id).double().T
        torch.testing.assert_close(
            qr.quant_linear_q8(x, blocks, fmt.type_id), exact.float(), rtol=1e-5, atol=1e-5
        )
        # 8 bits of x move the output by a hundredth of its range here, not more
        diff = qr.quant_linear_q8(x, blocks, fmt.type_id) - qr.quant_linear(x, blocks, fmt.type_id)
        assert 0 < float(diff.abs().max()) < 0.02 * float(exact.abs().max())


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda o: o.gguf_linear_q8(
                torch.zeros(2, 64), torch.zeros(3, 40, dtype=torch.uint8), 12
            ),
            "GGML type 12 has no kernel",
        ),
        (
            lambda o: o.gguf_linear_q8(
                torch.zeros(2, 32), torch.zeros(3, 40, dtype=torch.uint8), 3
            ),
            "x has 32 features, weight expects 64",
        ),
        (
            lambda o: o.gguf_linear_q8(
                torch.zeros(2, 64, dtype=torch.float64), torch.zeros(3, 40, dtype=torch.uint8), 3
            ),
            "x has dtype",
        ),
    ],
)
def test_bad_arguments_raise(ops: ModuleType, call: object, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        call(ops)  # type: ignore[operator]
