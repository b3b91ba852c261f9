"""GGUF blocks stored as panels (`kernels.quant_reference.pack_panels`) and the 8-bit GEMM that
reads them (`gguf_linear_q8(..., panels=True)`, kernels/cpu_gguf_q8_gemm.cpp's `rows` on
stored bytes), against
the reference of x rounded to 8 bits and against the same GEMM over the file's layout; and
`QuantWeight` storing them where x is rounded at every row count, and only there."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from kernels import cpu_ops
from kernels import quant_reference as qr
from worker.models import quant

FORMATS = [qr.Q4_0, qr.Q4_1, qr.Q8_0]


def random_blocks(n: int, k: int, fmt: qr.BlockFormat, seed: int = 0) -> torch.Tensor:
    """Blocks of random codes with small positive fp16 scales (and Q4_1 mins)."""
    gen = torch.Generator().manual_seed(seed)
    nb = k // qr.BLOCK
    b = torch.randint(0, 256, (n, nb, fmt.block_bytes), dtype=torch.uint8, generator=gen)
    scales = (torch.rand(n, nb, 2, generator=gen) * 0.02).half().view(torch.uint8)
    b[..., : fmt.head_bytes] = scales.reshape(n, nb, 4)[..., : fmt.head_bytes]
    return b.reshape(n, -1)


@pytest.fixture(scope="module")
def ops() -> ModuleType:
    module = cpu_ops.load()
    assert module is not None, cpu_ops.unavailable_reason()
    return module


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_panels_hold_the_same_bytes_in_panel_order(fmt: qr.BlockFormat) -> None:
    blocks = random_blocks(48, 96, fmt)
    panels = qr.pack_panels(blocks, fmt.type_id)
    assert panels.shape == blocks.shape and not torch.equal(panels, blocks)
    assert torch.equal(qr.unpack_panels(panels, fmt.type_id), blocks)
    # Panel 1, block 2: code word g of row i is bytes head + 4g .. of row 16 + i's block 2; the
    # rows' heads follow all the words.
    head = fmt.head_bytes
    words = (fmt.block_bytes - head) // 4
    at = panels[16:32].reshape(-1)[2 * 16 * fmt.block_bytes :]
    for i, g in [(0, 0), (5, 1), (15, words - 1)]:
        start = 2 * fmt.block_bytes + head + 4 * g
        word = (g * 16 + i) * 4
        assert torch.equal(at[word : word + 4], blocks[16 + i, start : start + 4])
        heads = words * 16 * 4 + i * head
        row_head = blocks[16 + i, 2 * fmt.block_bytes : 2 * fmt.block_bytes + head]
        assert torch.equal(at[heads : heads + head], row_head)
    with pytest.raises(ValueError, match="not whole panels of 16"):
        qr.pack_panels(blocks[:40], fmt.type_id)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_the_gemm_reads_stored_panels(ops: ModuleType, fmt: qr.BlockFormat) -> None:
    """Every row count runs the GEMM over panels (no one-row kernel, no per-call transpose);
    from the rows where the file's layout runs the same GEMM, the two agree bit for bit."""
    if ops.q8_panel_rows() != qr.PANEL_ROWS:
        pytest.skip("this build's 8-bit GEMM packs per call (AVX2): it reads no panels")
    blocks = random_blocks(64, 160, fmt, seed=1)
    panels = qr.pack_panels(blocks, fmt.type_id)
    bias = torch.randn(64)
    gen = torch.Generator().manual_seed(2)
    for rows in (1, 2, 5, 6, 17, 64, 130):
        x = torch.randn(rows, 160, generator=gen)
        got = ops.gguf_linear_q8(x, panels, fmt.type_id, bias, True)
        torch.testing.assert_close(got, qr.quant_linear_q8(x, blocks, fmt.type_id, bias))
        if rows >= 6:
            assert torch.equal(got, ops.gguf_linear_q8(x, blocks, fmt.type_id, bias))


def test_panels_must_be_whole(ops: ModuleType) -> None:
    blocks = random_blocks(24, 64, qr.Q4_1)
    with pytest.raises(RuntimeError, match="whole number of panels"):
        ops.gguf_linear_q8(torch.randn(2, 64), blocks, qr.Q4_1.type_id, None, True)


def test_quant_weights_store_panels_where_every_row_count_takes_them(ops: ModuleType) -> None:
    """int8 activations: stored as panels (where the build reads them and the rows are whole
    panels), read back in the file's layout for dequantizing; other activations, and weights an
    embedding looks rows up in, keep the file's layout."""
    blocks = random_blocks(64, 96, qr.Q4_1, seed=3)
    weight = quant.QuantWeight(blocks, qr.Q4_1.type_id)
    quant.attach(weight, ops, "int8")
    supported = ops.q8_panel_rows() == qr.PANEL_ROWS
    assert weight.panels is supported
    assert torch.equal(weight.data, qr.pack_panels(blocks, 3) if supported else blocks)
    assert weight.nbytes() == blocks.numel()
    assert torch.equal(weight.dequantize(), qr.dequantize(blocks, qr.Q4_1.type_id))
    x = torch.randn(3, 96)
    torch.testing.assert_close(
        weight.linear(x, None), qr.quant_linear_q8(x, blocks, qr.Q4_1.type_id, None)
    )
    quant.attach(weight, ops, "float32")
    assert not weight.panels and torch.equal(weight.data, blocks)
    odd = quant.QuantWeight(random_blocks(24, 96, qr.Q4_1), qr.Q4_1.type_id)
    quant.attach(odd, ops, "int8")
    assert not odd.panels  # 24 rows: not whole panels
    quant.attach(weight, ops, "int8")
    quant.QuantEmbedding(weight, torch.float32)  # tied: rows are looked up
    assert weight.row_lookups and not weight.panels and torch.equal(weight.data, blocks)
    quant.attach(weight, ops, "int8")
    assert not weight.panels


@pytest.mark.slow  # the -march=haswell build takes about a minute on 2 cores the first time
def test_the_avx2_build_reads_no_panels() -> None:
    avx2 = cpu_ops.load("haswell")
    assert avx2 is not None, cpu_ops.unavailable_reason("haswell")
    assert avx2.q8_panel_rows() == 0
    blocks = random_blocks(32, 64, qr.Q8_0)
    weight = quant.QuantWeight(blocks, qr.Q8_0.type_id)
    quant.attach(weight, avx2, "int8")
    assert not weight.panels
    with pytest.raises(RuntimeError, match="a build that reads them"):
        avx2.gguf_linear_q8(torch.randn(2, 64), blocks, qr.Q8_0.type_id, None, True)
