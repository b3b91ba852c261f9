"""Q4_1 blocks stored k-major (`quant_reference.pack_kmajor`) and the exact kernel that reads
them (kernels/cpu_gguf_kmajor.cpp), against the file's layout and the torch reference."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from kernels import cpu_ops
from kernels import quant_reference as qr
from tests.kernels.test_quant_linear_kernel import random_blocks

Q4_1 = qr.Q4_1.type_id


@pytest.fixture(scope="module")
def ops() -> ModuleType:
    module = cpu_ops.load()
    assert module is not None, cpu_ops.unavailable_reason()
    if not module.gguf_kmajor_supported(Q4_1):
        pytest.skip("this CPU's build has no k-major kernel (AVX-512 only)")
    return module


# n: one group of 32 columns, three (the threads' grain is 2), and the model's k/v width; k:
# one block, 3 blocks, the model's 576. Rows: one pass of 1-12, 12 and a rest of 1 or 5, several.
SHAPES = [(32, 32), (96, 96), (192, 576), (64, 1536)]
ROWS = [1, 2, 5, 11, 12, 13, 17, 24, 40]


@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_pack_and_unpack_keep_every_byte(n: int, k: int) -> None:
    blocks = random_blocks(qr.Q4_1, n, k, seed=n + k)
    packed = qr.pack_kmajor(blocks, Q4_1)
    assert packed.shape == blocks.shape and not torch.equal(packed, blocks)
    assert torch.equal(qr.unpack_kmajor(packed, Q4_1), blocks)
    index = torch.tensor([n - 1, 0, 5, 0, n // 2])  # repeats, out of order, across groups
    assert torch.equal(qr.kmajor_rows_of(packed, Q4_1, index), blocks[index])


@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_kernel_matches_the_reference(ops: ModuleType, n: int, k: int) -> None:
    blocks = random_blocks(qr.Q4_1, n, k, seed=n * k)
    packed = qr.pack_kmajor(blocks, Q4_1)
    # The file's dequantized weights, bit for bit: the kernel's fma(q, d, m) rounds once.
    assert torch.equal(ops.gguf_dequantize_kmajor(packed, Q4_1), qr.dequantize(blocks, Q4_1))
    bias = torch.randn(n)
    for rows in ROWS:
        x = torch.randn(rows, k)
        expected = qr.quant_linear(x, blocks, Q4_1, bias)
        got = ops.gguf_linear_kmajor(x, packed, Q4_1, bias)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        # The file layout's kernels compute the same sums in another order.
        file_layout = ops.gguf_linear(x, blocks, Q4_1, bias)
        torch.testing.assert_close(got, file_layout, rtol=1e-4, atol=1e-4)
    x = torch.randn(7, 2 * k)[:, :k]  # strided rows (a split of a fused projection)
    torch.testing.assert_close(
        ops.gguf_linear_kmajor(x, packed, Q4_1),
        qr.quant_linear(x, blocks, Q4_1),
        rtol=1e-4,
        atol=1e-4,
    )


def test_bad_arguments_raise(ops: ModuleType) -> None:
    blocks = random_blocks(qr.Q4_1, 48, 64, seed=1)
    with pytest.raises(RuntimeError, match="whole groups of 32"):
        ops.gguf_linear_kmajor(torch.randn(2, 64), blocks, Q4_1)
    q8 = random_blocks(qr.Q8_0, 32, 64, seed=2)
    with pytest.raises(RuntimeError, match="Q4_1"):
        ops.gguf_dequantize_kmajor(q8, qr.Q8_0.type_id)
    assert not ops.gguf_kmajor_supported(qr.Q8_0.type_id)
    with pytest.raises(ValueError, match="Q4_1 only"):
        qr.pack_kmajor(q8, qr.Q8_0.type_id)
    with pytest.raises(ValueError, match="whole groups of 32"):
        qr.pack_kmajor(blocks, Q4_1)


@pytest.mark.slow
def test_the_avx2_build_declines() -> None:
    module = cpu_ops.load("haswell")
    assert module is not None
    assert not module.gguf_kmajor_supported(Q4_1)
