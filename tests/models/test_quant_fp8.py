"""FP8 checkpoints (worker/models/quant_fp8.py) on a tiny synthetic compressed-tensors checkpoint
written here: dequantized exactly at load on the CPU, `Fp8Linear` after the swap CUDA makes, and
clear errors for the layouts we do not load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from kernels.triton_quant import FP8, WEIGHT_ONLY_MAX_ROWS, fp8_linear_reference, quantize_fp8
from tests.models.test_architectures import BASE
from worker.models import loader
from worker.models.loader import load_model
from worker.models.quant_fp8 import (
    COMPRESSED_TENSORS_FP8,
    Fp8Checkpoint,
    Fp8Linear,
    check_fp8_config,
    swap_fp8,
)

CPU = torch.device("cpu")
TINY: dict[str, Any] = {**BASE, "attention_bias": True}  # untied: lm_head stays a plain Linear
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PER_TENSOR = ("k_proj", "up_proj")  # the rest per channel: fused parts of either kind


def fp8_of(weight: torch.Tensor, per_tensor: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 codes and their scale: (1,) per tensor or (N, 1) per channel, as checkpoints hold."""
    if per_tensor:
        scale = weight.abs().amax().reshape(1) / 448.0
        return (weight / scale).to(FP8), scale
    codes, scale = quantize_fp8(weight)
    return codes, scale[:, None]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(FP8 checkpoint, the same weights dequantized as a float32 checkpoint)."""
    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", **TINY)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain, fp8 = tmp_path_factory.mktemp("plain"), tmp_path_factory.mktemp("fp8")
    model.save_pretrained(plain)
    state = load_file(str(plain / "model.safetensors"))
    quantized: dict[str, torch.Tensor] = {}
    for name, tensor in list(state.items()):
        kind = name.split(".")[-2]
        if kind in PROJECTIONS and name.endswith(".weight"):
            codes, scale = fp8_of(tensor, kind in PER_TENSOR)
            quantized[name] = codes
            quantized[name.removesuffix("weight") + "weight_scale"] = scale
            quantized[name.removesuffix("weight") + "input_scale"] = torch.ones(1)  # read past
            state[name] = codes.float() * scale
        else:
            quantized[name] = tensor
    save_file(state, str(plain / "model.safetensors"))
    save_file(quantized, str(fp8 / "model.safetensors"))
    raw = json.loads((plain / "config.json").read_text())
    raw["quantization_config"] = COMPRESSED_TENSORS_FP8
    (fp8 / "config.json").write_text(json.dumps(raw))
    return fp8, plain


def test_cpu_loads_the_dequantized_weights_exactly(checkpoints: tuple[Path, Path]) -> None:
    fp8_dir, plain_dir = checkpoints
    ours = load_model(fp8_dir, torch.float32, CPU, "auto")
    reference = load_model(plain_dir, torch.float32, CPU, "none")
    assert not any(isinstance(m, Fp8Linear) for m in ours.modules())  # CPU: dequantized
    theirs = reference.state_dict()
    for name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name


def loaded(fp8_dir: Path) -> tuple[nn.Module, Fp8Checkpoint]:
    """The model of the FP8 checkpoint and the codes and scales its load gathered (which
    `load_model` keeps only where it swaps them in: CUDA)."""
    model = load_model(fp8_dir, torch.float32, CPU, "none")
    state = Fp8Checkpoint.of(fp8_dir)
    assert state is not None
    loader._load_weights(model, fp8_dir, state)
    return model, state


def test_codes_and_per_row_scales_of_fused_projections(checkpoints: tuple[Path, Path]) -> None:
    model, state = loaded(checkpoints[0])
    weights = state.complete()
    assert len(weights) == 2 * 4  # qkv, o, gate_up, down per layer
    codes, scale = weights["layers.0.self_attn.qkv_proj.weight"]
    assert codes.dtype == FP8 and codes.shape == (48 + 2 * 16, 48) and scale.shape == (80,)
    assert torch.unique(scale[48:64]).numel() == 1  # k: one scale per tensor, repeated
    assert torch.unique(scale[:48]).numel() == 48  # q: one a channel
    fused = model.get_parameter("layers.0.self_attn.qkv_proj.weight")
    assert torch.equal(codes.float() * scale[:, None], fused)


def test_fp8_linear_after_the_swap_matches_the_reference(checkpoints: tuple[Path, Path]) -> None:
    model, state = loaded(checkpoints[0])
    dequantized = model.get_submodule("layers.1.mlp.gate_up_proj")
    assert isinstance(dequantized, nn.Linear)
    assert swap_fp8(model, state.complete(), CPU) == 8  # what CUDA sm_89+ does under auto
    swapped = model.get_submodule("layers.1.mlp.gate_up_proj")
    assert isinstance(swapped, Fp8Linear) and not any(
        type(m) is nn.Linear and m is not model.lm_head for m in model.modules()
    )
    # Decode rows: weight-only (x exact), so the dequantized float weights' own output.
    x = torch.randn(2, 5, 48)
    torch.testing.assert_close(swapped(x), dequantized(x), rtol=1e-5, atol=1e-5)
    # Past WEIGHT_ONLY_MAX_ROWS (prefill): _scaled_mm, activations rounded to e4m3 per row.
    rows = WEIGHT_ONLY_MAX_ROWS + 1
    x = torch.randn(rows, 48)
    expected = fp8_linear_reference(x, swapped.weight, swapped.scale, None)
    torch.testing.assert_close(swapped(x), expected, rtol=1e-5, atol=1e-5)
    # Against the float weights the only loss is the activations' e4m3 rounding (~6%).
    torch.testing.assert_close(swapped(x), dequantized(x), rtol=0.1, atol=0.15)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "block-wise scales"),
        ({"quant_method": "awq"}, "quant_method 'awq' is not supported"),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}},
            },
            "only 8-bit float",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "g": {"weights": {"num_bits": 8, "type": "float", "strategy": "block"}}
                },
            },
            "block scales",
        ),
    ],
)
def test_unsupported_layouts_are_refused(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_fp8_config(config)
    check_fp8_config(COMPRESSED_TENSORS_FP8)
    check_fp8_config({"quant_method": "fbgemm_fp8"})


def test_a_weight_without_its_scale_is_an_error(checkpoints: tuple[Path, Path]) -> None:
    fp8_dir, _ = checkpoints
    model = load_model(fp8_dir, torch.float32, CPU, "none")
    state = Fp8Checkpoint.of(fp8_dir)
    assert state is not None
    state.scales.pop("model.layers.0.self_attn.o_proj.weight")
    with pytest.raises(ValueError, match=r"o_proj\.weight is float8_e4m3fn but has no"):
        loader._load_weights(model, fp8_dir, state)
