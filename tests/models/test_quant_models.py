"""`--quantization` (worker/models/quant_loader.py): the bundled GGUF's own blocks, int8 made at
load, ``auto``'s choice, and an engine on the file's blocks against the torch references."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from worker.engine.config import EngineConfig
from worker.models import quant, quant_layers, quant_paths
from worker.models.loader import bundled_model_path, load_model, resolve_model_dir
from worker.models.quant_gguf import read_tensors
from worker.models.quant_loader import quantize_model

CPU = torch.device("cpu")


def test_read_tensors_matches_the_gguf_package() -> None:
    import gguf
    import numpy as np

    ours = read_tensors(bundled_model_path())
    theirs = gguf.GGUFReader(str(bundled_model_path())).tensors
    assert len(ours) == len(theirs) == 272
    for tensor in theirs:
        mine = ours[tensor.name]
        assert mine.type_id == int(tensor.tensor_type)
        raw = np.ascontiguousarray(tensor.data).view(np.uint8).reshape(-1)
        assert np.array_equal(mine.data.reshape(-1), raw)


@pytest.mark.parametrize("with_kernels", [True, False])
def test_quant_linear_agrees_with_the_reference_on_every_path(with_kernels: bool) -> None:
    import gguf

    from kernels import cpu_ops
    from kernels import quant_reference as qr

    w = torch.randn(70, 96)
    blocks = torch.from_numpy(gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q4_1))
    q, scale = qr.quantize_int8(w)
    bias = torch.randn(70)
    for weight in (quant.QuantWeight(blocks, qr.Q4_1.type_id), quant.QuantWeight(q, None, scale)):
        quant.attach(weight, cpu_ops.load() if with_kernels else None)
        linear = quant_layers.QuantLinear(weight, bias)
        gemm = weight.gemm_min_rows
        for rows in (1, 5, gemm - 1, gemm, 130):  # both sides
            x = torch.randn(rows, 96)
            expected = x @ weight.dequantize().T + bias
            torch.testing.assert_close(linear(x), expected, rtol=1e-4, atol=1e-4)
        ids = torch.tensor([[0, 69], [3, 3]])
        assert torch.equal(
            quant_layers.QuantEmbedding(weight, torch.float32)(ids)[1, 0], weight.dequantize()[3]
        )


def test_exact_blocks_are_stored_k_major_where_the_build_reads_them() -> None:
    """Where x stays exact (float32 activations) and our build has the k-major kernel, GGUF
    blocks are stored k-major (Q4_1 here, Q8_0 and Q4_0 at the end); every reader gives what
    the file's layout gives, and another mode or the torch references put the file's layout
    back."""
    import gguf

    from kernels import cpu_ops
    from kernels import quant_reference as qr

    ops = cpu_ops.load()
    if not ops.gguf_kmajor_supported(qr.Q4_1.type_id):
        pytest.skip("this CPU's build has no k-major kernel (AVX2 or AVX-512)")
    w = torch.randn(96, 64)
    blocks = torch.from_numpy(gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q4_1))
    weight = quant.QuantWeight(blocks, qr.Q4_1.type_id)
    quant.attach(weight, ops)
    assert weight.kmajor and not weight.panels and not torch.equal(weight.data, blocks)
    assert torch.equal(weight.blocks(), blocks)
    assert torch.equal(weight.dequantize(), qr.dequantize(blocks, qr.Q4_1.type_id))
    ids = torch.tensor([95, 0, 40, 40])
    assert torch.equal(weight.rows(ids), qr.dequantize(blocks[ids], qr.Q4_1.type_id))
    bias = torch.randn(96)
    linear = quant_layers.QuantLinear(weight, bias)
    for rows in (1, 13, weight.gemm_min_rows - 1, weight.gemm_min_rows):  # kernel, then GEMM
        x = torch.randn(rows, 64)
        expected = qr.quant_linear(x, blocks, qr.Q4_1.type_id, bias)
        torch.testing.assert_close(linear(x), expected, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(weight.linear(x, bias), expected, rtol=1e-4, atol=1e-4)
    quant.attach(weight, ops, "int8")  # x rounded: the 8-bit kernels' panels instead
    assert not weight.kmajor and torch.equal(weight.blocks(), blocks)
    quant.attach(weight, None)
    assert not weight.kmajor and not weight.panels and torch.equal(weight.data, blocks)
    for kind in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0):
        other_blocks = torch.from_numpy(gguf.quants.quantize(w.numpy(), kind))
        other = quant.QuantWeight(other_blocks, int(kind))
        quant.attach(other, ops)
        assert other.kmajor and torch.equal(other.blocks(), other_blocks)
        x = torch.randn(5, 64)
        torch.testing.assert_close(
            other.linear(x, None), qr.quant_linear(x, other_blocks, int(kind)), rtol=1e-4, atol=1e-4
        )
    odd = quant.QuantWeight(blocks[:80], qr.Q4_1.type_id)  # 80 rows: not whole groups of 32
    quant.attach(odd, ops)
    assert not odd.kmajor and torch.equal(odd.data, blocks[:80])


def test_gguf_keeps_the_bundled_files_blocks() -> None:
    model_dir = resolve_model_dir(None)
    fp32: Any = load_model(model_dir, torch.float32, CPU)
    ours: Any = load_model(model_dir, torch.float32, CPU, "gguf", None)
    assert not [m for m in ours.modules() if type(m) is nn.Linear]  # every projection swapped
    formats = [m.format_name for m in ours.modules() if isinstance(m, quant.QuantWeight)]
    assert formats.count("Q4_1") == 120 and formats.count("Q8_0") == 1  # embedding = head
    assert ours.lm_head.qweight is ours.embed_tokens.qweight
    # The projections in about a fifth of fp32's bytes (5 bits a weight of 32), no fp32 copy.
    linear_bytes = sum(
        m.qweight.nbytes()
        for n, m in ours.named_modules()
        if isinstance(m, quant_layers.QuantLinear)
        if n != "lm_head"
    )
    fp32_bytes = sum(m.weight.numel() * 4 for m in fp32.modules() if type(m) is nn.Linear) - (
        fp32.lm_head.weight.numel() * 4
    )
    assert linear_bytes * 6 < fp32_bytes
    assert sum(p.numel() for p in ours.parameters()) < 200_000  # only the norms stay float
    # Same weights (the loader checked each dequantizes exactly): same embeddings, same head.
    ids = torch.tensor([0, 5, 49151, 300])
    assert torch.equal(ours.embed_tokens(ids), fp32.embed_tokens(ids))
    x = torch.randn(3, 576)
    torch.testing.assert_close(ours.lm_head(x), fp32.lm_head(x), rtol=1e-4, atol=1e-4)
    qkv = ours.layers[7].self_attn.qkv_proj  # q and k rows un-permuted from llama.cpp's order
    expected = fp32.layers[7].self_attn.qkv_proj(x)
    torch.testing.assert_close(qkv(x), expected, rtol=1e-4, atol=1e-4)


def test_int8_from_float_weights(tiny_model_dir: Path) -> None:
    model_dir = tiny_model_dir
    fp32: Any = load_model(model_dir, torch.float32, CPU)
    ours: Any = load_model(model_dir, torch.float32, CPU, "int8")
    assert not [m for m in ours.modules() if type(m) is nn.Linear]
    assert ours.lm_head.qweight is ours.embed_tokens.qweight  # tied: one int8 table
    weights = [m for m in ours.modules() if isinstance(m, quant.QuantWeight)]
    assert len(weights) == 2 * 4 + 1 and all(w.format_name == "int8" for w in weights)
    ids, x, h = torch.tensor([1, 7, 100]), torch.randn(5, 32), torch.randn(5, 64)
    with torch.inference_mode():
        pairs = [
            (ours.embed_tokens(ids), fp32.embed_tokens(ids)),
            (ours.lm_head(x), fp32.lm_head(x)),
            (ours.layers[1].mlp.down_proj(h), fp32.layers[1].mlp.down_proj(h)),
        ]
    for got, want in pairs:  # 127 levels a row: a few hundredths of the output's range at most
        assert 0 < float((got - want).abs().max()) < 0.03 * float(want.abs().max())


def test_int8_on_cuda_swaps_every_projection_but_the_head(tiny_model_dir: Path) -> None:
    """CUDA's int8 (worker/models/quant_cuda.py), its Triton GEMM run here by the interpreter:
    every projection but the LM head becomes an `Int8Linear`, and a forward stays within int8's
    rounding of the float model's."""
    from worker.models.quant_cuda import Int8Linear, to_int8

    fp32: Any = load_model(tiny_model_dir, torch.float32, CPU)
    ours: Any = load_model(tiny_model_dir, torch.float32, CPU)
    assert to_int8(ours) == 2 * 4
    assert type(ours.lm_head) is nn.Linear and not [
        m for n, m in ours.named_modules() if type(m) is nn.Linear and n != "lm_head"
    ]
    h = torch.randn(5, 64)
    with torch.inference_mode():
        got, want = ours.layers[1].mlp.down_proj(h), fp32.layers[1].mlp.down_proj(h)
    assert isinstance(ours.layers[1].mlp.down_proj, Int8Linear)
    assert 0 < float((got - want).abs().max()) < 0.03 * float(want.abs().max())


def test_auto_and_bad_modes(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir, torch.float32, CPU)
    assert quantize_model(model, "auto", None, CPU) == "none"  # not a GGUF: float as loaded
    assert quantize_model(model, "none", None, CPU) == "none"
    with pytest.raises(ValueError, match=r"needs a \.gguf model"):
        quantize_model(model, "gguf", None, CPU)
    with pytest.raises(ValueError, match="unknown quantization 'q2'"):
        quantize_model(model, "q2", None, CPU)
    with pytest.raises(ValueError, match="CPU only"):
        quantize_model(model, "gguf", None, torch.device("cuda"))
    assert type(model.lm_head) is nn.Linear  # nothing was swapped by the refusals
    parser = argparse.ArgumentParser()
    EngineConfig.add_arguments(parser)
    assert EngineConfig.from_args(parser.parse_args(["--quantization", "int8"])).quantization == (
        "int8"
    )
    assert EngineConfig().quantization == "auto"


@pytest.mark.parametrize("arch", [None, pytest.param("haswell", marks=pytest.mark.slow)])
def test_int8_activations_take_gguf_blocks_only(tiny_model_dir: Path, arch: str | None) -> None:
    """``--quant-activations int8``: `QuantLinear` rounds x to 8 bits (`gguf_linear_q8`) at any
    row count, on either build's panel GEMM (VNNI or AVX2) past 2 rows; weights that are not
    GGUF blocks are refused with an error that says so."""
    import gguf

    from kernels import cpu_ops
    from kernels import quant_reference as qr

    ops = cpu_ops.load(arch)
    assert ops is not None
    w = torch.randn(70, 96)
    blocks = torch.from_numpy(gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q4_1))
    weight = quant.QuantWeight(blocks, qr.Q4_1.type_id)
    linear, bias = quant_layers.QuantLinear(weight, torch.randn(70)), torch.randn(70)
    linear.bias = nn.Parameter(bias, False)
    quant.attach(weight, ops, "int8")
    assert weight.a8_max_rows == quant_paths.ANY_ROWS
    for rows in (1, 2, 3, 40, 130):  # the one-row kernel, the panel GEMM, past the exact GEMM's
        x = torch.randn(rows, 96)
        rounded = qr.quant_linear_q8(x, blocks, qr.Q4_1.type_id, bias)
        for got in (linear(x), weight.linear(x, bias)):  # the fast path and the general one
            torch.testing.assert_close(got, rounded)
    int8 = quant.QuantWeight(*qr.quantize_int8(w)[:1], None, torch.ones(70))
    quant.attach(int8, ops, "int8")
    assert int8.a8_max_rows == 0  # int8 weights keep x exact
    with pytest.raises(ValueError, match="unknown activations 'int4'"):
        quant.attach(weight, ops, "int4")
    model = load_model(tiny_model_dir, torch.float32, CPU)
    with pytest.raises(ValueError, match=r"--quant-activations int8 needs GGUF blocks.*int8"):
        quantize_model(model, "int8", None, CPU, "int8")
    assert type(model.lm_head) is nn.Linear  # refused before anything was swapped
    with pytest.raises(ValueError, match=r"needs GGUF blocks.*--quantization none"):
        load_model(tiny_model_dir, torch.float32, CPU, "auto", None, "int8")
    parser = argparse.ArgumentParser()
    EngineConfig.add_arguments(parser)
    args = parser.parse_args(["--quant-activations", "int8"])
    assert EngineConfig.from_args(args).quant_activations == "int8"
    assert EngineConfig().quant_activations == "float32"


@pytest.mark.parametrize(
    ("activations", "amx"), [("bfloat16", False), ("int8+bfloat16", True), ("int8+bfloat16", False)]
)
@pytest.mark.parametrize("supported", [True, False])
def test_bfloat16_activations_multiply_many_row_steps_in_bf16(
    activations: str, amx: bool, supported: bool, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """``--quant-activations bfloat16``: from `BF16_GEMM_MIN_ROWS` rows x and the dequantized
    weight are rounded to bf16 (fp32 out, bias added in fp32); fewer rows stay exact, or with
    ``int8+bfloat16`` are rounded to 8 bits (`gguf_linear_q8`), up to where bf16 overtakes
    int8's GEMM (`BF16_OVER_INT8_MIN_ROWS`), which it never does without AMX (int8 at every
    row count, said in the log); int8 weights and float32
    activations never round. Where oneDNN has no bf16 arithmetic (AVX2: emulated, 4.5x the
    exact path's time) every step stays as if bf16 were not named, with a warning."""
    import gguf

    from kernels import cpu_ops
    from kernels import quant_reference as qr

    ops = cpu_ops.load(None)
    assert ops is not None
    monkeypatch.setattr(quant, "bf16_gemm_supported", lambda: supported)
    monkeypatch.setattr(quant, "amx_supported", lambda: amx)
    w = torch.randn(70, 96)
    blocks = torch.from_numpy(gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q4_1))
    weight = quant.QuantWeight(blocks, qr.Q4_1.type_id)
    bias = torch.randn(70)
    linear = quant_layers.QuantLinear(weight, bias)
    with caplog.at_level(logging.INFO, logger=quant.__name__):
        quant.attach(weight, ops, activations)
    assert ("no bf16 arithmetic" in caplog.text) is not supported
    a8 = activations == "int8+bfloat16"
    assert ("has no AMX" in caplog.text) is (a8 and supported and not amx)
    bf16_rows = quant_paths.BF16_OVER_INT8_MIN_ROWS if a8 else quant_paths.BF16_GEMM_MIN_ROWS
    limit = bf16_rows if supported and (amx or not a8) else quant_paths.ANY_ROWS
    a8_rows = limit - 1 if limit != quant_paths.ANY_ROWS else quant_paths.ANY_ROWS
    assert weight.bf16_min_rows == limit and weight.a8_max_rows == (a8_rows if a8 else 0)
    w16 = qr.dequantize(blocks, qr.Q4_1.type_id).to(torch.bfloat16)
    for rows in (1, 3, bf16_rows - 1, bf16_rows, 130):
        x = torch.randn(rows, 96)
        exact = qr.quant_linear(x, blocks, qr.Q4_1.type_id, bias)
        rounded = nn.functional.linear(x.to(torch.bfloat16), w16).float() + bias
        for got in (linear(x), weight.linear(x, bias)):  # the fast path and the general one
            if rows <= weight.a8_max_rows:
                torch.testing.assert_close(got, qr.quant_linear_q8(x, blocks, 3, bias))
            elif rows < limit:
                torch.testing.assert_close(got, exact)
            else:  # the same bf16 products; oneDNN may sum them in another order
                torch.testing.assert_close(got, rounded, atol=2e-2, rtol=1e-2)
                assert not torch.allclose(got, exact, atol=1e-4, rtol=0)  # it did round
    parser = argparse.ArgumentParser()
    EngineConfig.add_arguments(parser)
    args = parser.parse_args(["--quant-activations", activations])
    assert EngineConfig.from_args(args).quant_activations == activations
    for other, activations in (
        (weight, "float32"),
        (quant.QuantWeight(*qr.quantize_int8(w)[:1], None, torch.ones(70)), "bfloat16"),
    ):
        quant.attach(other, ops, activations)
        assert other.bf16_min_rows == quant_paths.ANY_ROWS


@pytest.mark.slow
def test_engine_on_gguf_blocks_matches_the_torch_reference() -> None:
    from worker.engine.llm_engine import LLMEngine
    from worker.engine.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig())  # auto: the bundled file is Q4_1, so its blocks
    model: Any = engine.runner.model
    assert engine.num_packed_linears == 0 and quant.quantized_bytes(model) < 100e6
    prompts = ["The capital of France is", "def fibonacci(n):\n    "]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    ours = [list(o.token_ids) for o in engine.generate(prompts, params)]
    ops = model.lm_head.qweight.ops
    assert ops is not None  # the C++ kernels ran above
    quant.attach(model, None)  # the same weights through kernels/quant_reference.py
    try:
        reference = [list(o.token_ids) for o in engine.generate(prompts, params)]
    finally:
        quant.attach(model, ops)
    assert ours == reference


@pytest.mark.parametrize("arch", [None, pytest.param("haswell", marks=pytest.mark.slow)])
def test_the_gemm_threshold_follows_the_kernels_isa(arch: str | None) -> None:
    """Each ISA's exact kernels hand over to dequantize + `F.linear` at its own row count
    (`quant_paths.GEMM_MIN_ROWS`: AVX-512 from 80, AVX2 from 64; blocks stored k-major from
    1,024 and 256), so each weight takes its build's."""
    from kernels import cpu_ops
    from kernels import quant_reference as qr

    ops = cpu_ops.load(arch)
    assert ops is not None
    isa = ops.quant_isa()
    blocks = quant.QuantWeight(torch.zeros(4, 20, dtype=torch.uint8), qr.Q4_1.type_id)
    group = quant.QuantWeight(torch.zeros(32, 20, dtype=torch.uint8), qr.Q4_1.type_id)
    codes = quant.QuantWeight(torch.zeros(4, 32, dtype=torch.int8), None, torch.ones(4))
    at = quant_paths.GEMM_MIN_ROWS[isa]
    for weight, rows, kmajor in ((blocks, at.gguf, False), (group, at.kmajor, True)):
        quant.attach(weight, ops)
        assert (weight.gemm_min_rows, weight.kmajor) == (rows, kmajor)
    quant.attach(codes, ops)
    assert (codes.gemm_min_rows, codes.kmajor) == (at.int8, False)
    quant.attach(group, ops, "int8")  # panels: the file layout's threshold again
    assert (group.gemm_min_rows, group.kmajor) == (at.gguf, False)
    # -march=native takes the AVX-512 paths only where the machine has them: an AVX2-only AMD
    # EPYC (no avx512f in its flags) built "avx2" natively, as haswell does everywhere.
    native_avx512 = "avx512f" in Path("/proc/cpuinfo").read_text().split()
    assert ops.quant_isa() == ("avx512" if arch is None and native_avx512 else "avx2")
    rows_by_isa = quant_paths.GEMM_MIN_ROWS
    assert rows_by_isa["avx2"] != rows_by_isa["avx512"]  # the ISA decides
