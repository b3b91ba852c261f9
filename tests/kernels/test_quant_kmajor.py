"""GGUF blocks stored k-major (`quant_reference.pack_kmajor`) and the exact kernel that reads
them (kernels/cpu_gguf_kmajor.cpp), against the file's layout and the torch reference, in the
native build and in the AVX2 one."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from kernels import cpu_ops
from kernels import quant_reference as qr
from tests.kernels.test_quant_linear_kernel import random_blocks

Q4_1 = qr.Q4_1.type_id
FORMATS = [qr.Q4_0, qr.Q4_1, qr.Q8_0]


@pytest.fixture(
    scope="module",
    params=[None, pytest.param("haswell", marks=pytest.mark.slow)],  # native, and AVX2 alone
    ids=["native", "avx2"],
)
def ops(request: pytest.FixtureRequest) -> ModuleType:
    module = cpu_ops.load(request.param)
    assert module is not None, cpu_ops.unavailable_reason(request.param)
    if request.param == "haswell":  # the AVX2 half-group passes, whatever this CPU has
        assert module.quant_isa() == "avx2" and module.gguf_kmajor_supported(Q4_1)
    elif not module.gguf_kmajor_supported(Q4_1):
        pytest.skip("this CPU's build has no k-major kernel (AVX2 or AVX-512)")
    return module


# n: one group of 32 columns, three (the threads' grain is 2), and the model's k/v width; k:
# one block, 3 blocks, the model's 576 (18 blocks: the AVX-512 tile's 4 blocks leave 2), 1,536
# (48). Rows: AVX-512's passes of 12 (one, a rest of 1 or 5, several) below 32 and its tile's of
# 12 from 32 (32, 37 and 40 leave 8, 1 and 4); AVX2's of 4 below 16 rows (rests of 1 and 3) and
# its tile's of 6 from 16 (16, 17 and 40 leave 4, 5 and 4).
SHAPES = [(32, 32), (96, 96), (192, 576), (64, 1536)]
ROWS = [1, 2, 5, 11, 12, 13, 15, 16, 17, 24, 31, 32, 37, 40]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_pack_and_unpack_keep_every_byte(fmt: qr.BlockFormat, n: int, k: int) -> None:
    blocks = random_blocks(fmt, n, k, seed=n + k)
    packed = qr.pack_kmajor(blocks, fmt.type_id)
    assert packed.shape == blocks.shape and not torch.equal(packed, blocks)
    assert torch.equal(qr.unpack_kmajor(packed, fmt.type_id), blocks)
    index = torch.tensor([n - 1, 0, 5, 0, n // 2])  # repeats, out of order, across groups
    assert torch.equal(qr.kmajor_rows_of(packed, fmt.type_id, index), blocks[index])


def test_the_layout_puts_each_field_where_the_kernel_reads_it() -> None:
    """One group, one block: the heads of all 32 rows, then a line a k (Q8_0: row c's code in
    byte c; 4-bit: row c's in byte c % 16, the high nibble from row 16)."""
    for fmt in FORMATS:
        blocks = random_blocks(fmt, 32, 32, seed=fmt.type_id)
        packed = qr.pack_kmajor(blocks, fmt.type_id).reshape(-1)  # the group's 32 blocks
        head = fmt.head_bytes
        d = blocks[:, 0:2].reshape(-1)  # each row's fp16 d, row after row
        assert torch.equal(packed[:64], d)
        if fmt is qr.Q4_1:
            assert torch.equal(packed[64:128], blocks[:, 2:4].reshape(-1))
        lines = packed[32 * head :].reshape(32, -1)  # (k, line bytes)
        q, _, _ = qr.weight_codes(blocks, fmt.type_id)  # (32 rows, 1, 32 k) as floats
        codes = q[:, 0].t()  # (k, row)
        if fmt is qr.Q8_0:
            assert torch.equal(lines.view(torch.int8).float(), codes)
        else:
            assert torch.equal((lines & 0x0F).float(), codes[:, :16])
            assert torch.equal((lines >> 4).float(), codes[:, 16:])


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_kernel_matches_the_reference(ops: ModuleType, fmt: qr.BlockFormat, n: int, k: int) -> None:
    t = fmt.type_id
    blocks = random_blocks(fmt, n, k, seed=n * k)
    packed = qr.pack_kmajor(blocks, t)
    # The file's dequantized weights, bit for bit: the kernel's fma(q, d, m) rounds once, as
    # do Q4_0's fma(q, d, -8 d) and Q8_0's q * d.
    assert torch.equal(ops.gguf_dequantize_kmajor(packed, t), qr.dequantize(blocks, t))
    bias = torch.randn(n)
    for rows in ROWS:
        x = torch.randn(rows, k)
        expected = qr.quant_linear(x, blocks, t, bias)
        got = ops.gguf_linear_kmajor(x, packed, t, bias)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        # The file layout's kernels compute the same sums in another order.
        file_layout = ops.gguf_linear(x, blocks, t, bias)
        torch.testing.assert_close(got, file_layout, rtol=1e-4, atol=1e-4)
    index = torch.tensor([n - 1, 0, 17, 17, n // 2, 16, 15])  # both nibbles' rows, repeats
    assert torch.equal(ops.gguf_kmajor_rows(packed, t, index), blocks[index])
    assert ops.gguf_kmajor_rows(packed, t, index[:0]).shape == (0, blocks.shape[1])
    x = torch.randn(7, 2 * k)[:, :k]  # strided rows (a split of a fused projection)
    torch.testing.assert_close(
        ops.gguf_linear_kmajor(x, packed, t),
        qr.quant_linear(x, blocks, t),
        rtol=1e-4,
        atol=1e-4,
    )


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_a_row_gets_the_same_bits_whatever_the_rows_beside_it(
    ops: ModuleType, fmt: qr.BlockFormat
) -> None:
    """Passes of any size and the tiles run the same FMAs in the same order, so a row's output
    does not depend on how many rows share the call (register passes below a tile's rows, the
    tile from there, and the rests of either)."""
    t = fmt.type_id
    blocks = random_blocks(fmt, 96, 576, seed=t)
    packed = qr.pack_kmajor(blocks, t)
    x = torch.randn(100, 576)
    every = ops.gguf_linear_kmajor(x, packed, t)
    for rows in (1, 3, 12, 13, 16, 17, 31, 32, 45):
        assert torch.equal(ops.gguf_linear_kmajor(x[-rows:], packed, t), every[-rows:]), rows


def test_bad_arguments_raise(ops: ModuleType) -> None:
    blocks = random_blocks(qr.Q4_1, 48, 64, seed=1)
    with pytest.raises(RuntimeError, match="whole groups of 32"):
        ops.gguf_linear_kmajor(torch.randn(2, 64), blocks, Q4_1)
    q4_k = 12  # GGML's Q4_K: no kernel here, stored k-major or not
    assert not ops.gguf_kmajor_supported(q4_k)
    with pytest.raises(RuntimeError, match="no kernel here"):
        ops.gguf_dequantize_kmajor(random_blocks(qr.Q4_1, 32, 64, seed=2), q4_k)
    with pytest.raises(ValueError, match="no kernel here"):
        qr.pack_kmajor(blocks, q4_k)
    with pytest.raises(ValueError, match="whole groups of 32"):
        qr.pack_kmajor(blocks, Q4_1)
    packed = qr.pack_kmajor(blocks[:32], Q4_1)
    with pytest.raises(RuntimeError, match="row 32 of 32"):
        ops.gguf_kmajor_rows(packed, Q4_1, torch.tensor([0, 32]))
    with pytest.raises(RuntimeError, match="index"):
        ops.gguf_kmajor_rows(packed, Q4_1, torch.tensor([0.0]))
