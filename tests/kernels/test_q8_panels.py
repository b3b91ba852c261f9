"""GGUF blocks stored as panels (`kernels.quant_reference.pack_panels`) and the 8-bit GEMM that
reads them (`gguf_linear_q8(..., panels=True)`: `rows` on stored bytes, 16-row panels in
kernels/cpu_gguf_q8_gemm.cpp with AVX-512 VNNI, 8-row ones in cpu_gguf_q8_gemm_avx2.cpp),
against the reference of x rounded to 8 bits and against the same GEMM over the file's layout;
`gguf_dequantize` reading them back; and `QuantWeight` storing them where every row count is
either rounded to 8 bits or dequantized to bf16, and only there."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from kernels import cpu_ops
from kernels import quant_reference as qr
from worker.models import quant, quant_layers, quant_paths

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


@pytest.fixture(scope="module")
def avx2() -> ModuleType:
    """The -march=haswell build: its AVX2 GEMM (about a minute on 2 cores the first time)."""
    module = cpu_ops.load("haswell")
    assert module is not None, cpu_ops.unavailable_reason("haswell")
    return module


@pytest.mark.parametrize("rows", [8, 16])
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_panels_hold_the_same_bytes_in_panel_order(fmt: qr.BlockFormat, rows: int) -> None:
    blocks = random_blocks(48, 96, fmt)
    panels = qr.pack_panels(blocks, fmt.type_id, rows)
    assert panels.shape == blocks.shape and not torch.equal(panels, blocks)
    assert torch.equal(qr.unpack_panels(panels, fmt.type_id, rows), blocks)
    some = torch.tensor([47, 0, rows, rows - 1, 5, 5])
    assert torch.equal(qr.panel_rows_of(panels, fmt.type_id, rows, some), blocks[some])
    # Panel 1, block 2: code word g of row i is bytes head + 4g .. of row rows + i's block 2;
    # the rows' heads follow all the words.
    head = fmt.head_bytes
    words = (fmt.block_bytes - head) // 4
    at = panels[rows : 2 * rows].reshape(-1)[2 * rows * fmt.block_bytes :]
    for i, g in [(0, 0), (5, 1), (rows - 1, words - 1)]:
        start = 2 * fmt.block_bytes + head + 4 * g
        word = (g * rows + i) * 4
        assert torch.equal(at[word : word + 4], blocks[rows + i, start : start + 4])
        heads = words * rows * 4 + i * head
        row_head = blocks[rows + i, 2 * fmt.block_bytes : 2 * fmt.block_bytes + head]
        assert torch.equal(at[heads : heads + head], row_head)
    with pytest.raises(ValueError, match=f"not whole panels of {rows}"):
        qr.pack_panels(blocks[:44], fmt.type_id, rows)


def check_gemm_on_panels(module: ModuleType, fmt: qr.BlockFormat) -> None:
    """Every row count runs the GEMM over ``module``'s panels (no one-row kernel, no per-call
    transpose); from the rows where the file's layout runs the same GEMM (6 for every format
    with VNNI, 3 or Q8_0's 6 on AVX2), the two agree bit for bit."""
    blocks = random_blocks(64, 160, fmt, seed=1)
    panels = qr.pack_panels(blocks, fmt.type_id, module.q8_panel_rows())
    bias = torch.randn(64)
    gen = torch.Generator().manual_seed(2)
    for rows in (1, 2, 5, 6, 17, 64, 130):
        x = torch.randn(rows, 160, generator=gen)
        got = module.gguf_linear_q8(x, panels, fmt.type_id, bias, True)
        torch.testing.assert_close(got, qr.quant_linear_q8(x, blocks, fmt.type_id, bias))
        if rows >= 6:
            assert torch.equal(got, module.gguf_linear_q8(x, blocks, fmt.type_id, bias))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_the_gemm_reads_stored_panels(ops: ModuleType, fmt: qr.BlockFormat) -> None:
    check_gemm_on_panels(ops, fmt)


@pytest.mark.slow  # the -march=haswell build, the first time
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_the_avx2_gemm_reads_stored_panels(avx2: ModuleType, fmt: qr.BlockFormat) -> None:
    assert avx2.q8_panel_rows() == 8
    check_gemm_on_panels(avx2, fmt)


def test_panels_must_be_whole(ops: ModuleType) -> None:
    rows = ops.q8_panel_rows()
    blocks = random_blocks(rows + 4, 64, qr.Q4_1)
    with pytest.raises(RuntimeError, match="whole number of panels"):
        ops.gguf_linear_q8(torch.randn(2, 64), blocks, qr.Q4_1.type_id, None, True)


def check_dequantize_on_panels(module: ModuleType, fmt: qr.BlockFormat, rows: int) -> None:
    """`gguf_dequantize(..., panel_rows)` gives the file layout's weights, bit for bit, in fp32
    and in bf16 (k not a power of two: 3 blocks)."""
    blocks = random_blocks(2 * rows, 96, fmt, seed=rows)
    panels = qr.pack_panels(blocks, fmt.type_id, rows)
    want = qr.dequantize(blocks, fmt.type_id)
    assert torch.equal(module.gguf_dequantize(panels, fmt.type_id, False, rows), want)
    got16 = module.gguf_dequantize(panels, fmt.type_id, True, rows)
    assert torch.equal(got16, want.to(torch.bfloat16))
    assert not torch.equal(module.gguf_dequantize(panels, fmt.type_id), want)  # not the file's
    with pytest.raises(RuntimeError, match="panel_rows must be 0 or divide"):
        module.gguf_dequantize(panels, fmt.type_id, False, 3 * rows)


@pytest.mark.parametrize("rows", [6, 8, 16])
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_dequantize_reads_stored_panels(ops: ModuleType, fmt: qr.BlockFormat, rows: int) -> None:
    """Panels of either build's rows (AVX-512 builds read 4 rows at a time from registers), and
    of 6 (one row at a time, as AVX2 builds read them)."""
    check_dequantize_on_panels(ops, fmt, rows)


@pytest.mark.slow  # the -march=haswell build, the first time
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_the_avx2_build_dequantizes_stored_panels(avx2: ModuleType, fmt: qr.BlockFormat) -> None:
    check_dequantize_on_panels(avx2, fmt, avx2.q8_panel_rows())


def test_quant_weights_store_panels_where_every_row_count_takes_them(ops: ModuleType) -> None:
    """int8 activations: stored as panels of the build's rows (where the rows are whole
    panels), read back in the file's layout for dequantizing and by the rows an embedding looks
    up; other activations keep the file's layout."""
    blocks = random_blocks(64, 96, qr.Q4_1, seed=3)
    weight = quant.QuantWeight(blocks, qr.Q4_1.type_id)
    quant.attach(weight, ops, "int8")
    rows = ops.q8_panel_rows()
    assert weight.panels and weight.panel_rows == rows
    assert torch.equal(weight.data, qr.pack_panels(blocks, 3, rows))
    assert weight.nbytes() == blocks.numel()
    assert torch.equal(weight.dequantize(), qr.dequantize(blocks, qr.Q4_1.type_id))
    x = torch.randn(3, 96)
    torch.testing.assert_close(
        weight.linear(x, None), qr.quant_linear_q8(x, blocks, qr.Q4_1.type_id, None)
    )
    quant.attach(weight, ops, "float32")  # exact x: no panels (k-major where the build reads it)
    assert not weight.panels and torch.equal(weight.blocks(), blocks)
    assert weight.kmajor == ops.gguf_kmajor_supported(qr.Q4_1.type_id)
    odd = quant.QuantWeight(random_blocks(rows + 4, 96, qr.Q4_1), qr.Q4_1.type_id)
    quant.attach(odd, ops, "int8")
    assert not odd.panels  # not whole panels
    quant.attach(weight, ops, "int8")
    # Tied: an embedding looks rows up in the panels, each row's bytes gathered from its panel.
    embedding = quant_layers.QuantEmbedding(weight, torch.float32)
    assert weight.panels
    ids = torch.tensor([[0, 63, 17], [rows, rows - 1, 5]])
    want = qr.dequantize(blocks[ids.reshape(-1)], qr.Q4_1.type_id).reshape(2, 3, 96)
    assert torch.equal(embedding(ids), want)
    quant.attach(weight, ops, "float32")
    assert torch.equal(embedding(ids), want)


@pytest.mark.slow  # the -march=haswell build, the first time
def test_weights_move_between_builds_with_their_panel_rows(
    ops: ModuleType, avx2: ModuleType
) -> None:
    """Re-attached to a build of other panel rows, a weight is stored again in that build's
    panels, from the same bytes, and gives that build's products."""
    blocks = random_blocks(48, 64, qr.Q8_0, seed=4)
    weight = quant.QuantWeight(blocks, qr.Q8_0.type_id)
    x = torch.randn(4, 64)
    ids = torch.tensor([47, 0, 9, 8])
    for module in (ops, avx2, ops):
        quant.attach(weight, module, "int8")
        rows = module.q8_panel_rows()
        assert weight.panel_rows == rows
        assert torch.equal(weight.data, qr.pack_panels(blocks, qr.Q8_0.type_id, rows))
        torch.testing.assert_close(
            weight.linear(x, None), qr.quant_linear_q8(x, blocks, qr.Q8_0.type_id, None)
        )
        assert torch.equal(weight.rows(ids), qr.dequantize(blocks[ids], qr.Q8_0.type_id))
    assert torch.equal(weight.blocks(), blocks)


def test_int8_below_bf16_stores_panels_and_dequantizes_them(
    ops: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """int8+bfloat16 where bf16 takes over from `BF16_OVER_INT8_MIN_ROWS` (AMX): the weight is
    stored as panels, which x's 8-bit GEMM reads below those rows and the bf16 GEMM's
    dequantizing reads from them; a weight too large to dequantize per call
    (`GEMM_MAX_BYTES`) never takes bf16, so x is rounded to 8 bits at every row count."""
    monkeypatch.setattr(quant, "bf16_gemm_supported", lambda: True)
    monkeypatch.setattr(quant, "amx_supported", lambda: True)
    rows = ops.q8_panel_rows()
    blocks = random_blocks(4 * rows, 96, qr.Q4_1, seed=6)
    weight = quant.QuantWeight(blocks, qr.Q4_1.type_id)
    quant.attach(weight, ops, "int8+bfloat16")
    top = quant_paths.BF16_OVER_INT8_MIN_ROWS
    assert weight.panels and (weight.a8_max_rows, weight.bf16_min_rows) == (top - 1, top)
    w16 = qr.dequantize(blocks, qr.Q4_1.type_id).to(torch.bfloat16)
    assert torch.equal(weight.dequantize(bf16=True), w16)
    bias = torch.randn(4 * rows)
    linear = quant_layers.QuantLinear(weight, bias)
    for n in (1, 5, top - 1, top, top + 7):
        x = torch.randn(n, 96)
        for got in (linear(x), weight.linear(x, bias)):
            if n < top:
                want = qr.quant_linear_q8(x, blocks, qr.Q4_1.type_id, bias)
                torch.testing.assert_close(got, want)
            else:  # the same bf16 products; oneDNN may sum them in another order
                want = torch.nn.functional.linear(x.to(torch.bfloat16), w16).float() + bias
                torch.testing.assert_close(got, want, atol=2e-2, rtol=1e-2)
    monkeypatch.setattr(quant_paths, "GEMM_MAX_BYTES", weight.in_features * weight.out_features * 2)
    quant.attach(weight, ops, "int8+bfloat16")
    assert weight.panels and weight.a8_max_rows == weight.bf16_min_rows == quant_paths.ANY_ROWS
    assert weight.gemm_min_rows == quant_paths.ANY_ROWS
    x = torch.randn(top + 7, 96)
    want = qr.quant_linear_q8(x, blocks, qr.Q4_1.type_id, bias)
    torch.testing.assert_close(linear(x), want)
    quant.attach(weight, ops, "float32")  # the exact kernels: the file's layout, or k-major
    assert not weight.panels and torch.equal(weight.blocks(), blocks)
    assert weight.kmajor == ops.gguf_kmajor_supported(qr.Q4_1.type_id)
    torch.testing.assert_close(linear(x), qr.quant_linear(x, blocks, qr.Q4_1.type_id, bias))
