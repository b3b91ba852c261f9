"""FP8 (e4m3) checkpoints: Hugging Face / compressed-tensors ``weight`` in ``float8_e4m3fn`` with
a ``weight_scale`` per tensor or per output channel, as ``quantization_config`` in config.json
says (``quant_method`` ``compressed-tensors`` with 8-bit float weights, or ``fbgemm_fp8``).

Loading (`Fp8Checkpoint`, used by worker/models/loader.py): every projection's float parameter
is filled with the dequantized values ``code * scale`` (so every path can run the model), and
the codes and scales are kept beside it, one ``(N,)`` float32 scale a row: a per-tensor scale
is repeated over the tensor's rows, so fused q/k/v and gate/up, whose parts carry their own
scales, become one per-channel weight. Then, by device:

- CUDA with row-wise ``_scaled_mm`` (sm_89+) and ``--quantization auto``: each such projection
  becomes an `Fp8Linear` holding only the codes and scales (the float copy is dropped): decode
  steps widen the codes in a Triton kernel, prefill chunks run ``_scaled_mm``.
- The CPU, older GPUs, or ``--quantization none``: the dequantized weights stay, in the model's
  dtype (on the CPU float32, exact: e4m3 times a float32 scale). We dequantize rather than
  refuse: the CPU has no FP8 arithmetic and ``int8`` can be made from these floats like any.

Refused with a ValueError naming what is found: block-wise or group-wise scales (``quant_method
fp8`` with ``weight_block_size``, ``weight_scale_inv``) and other bit widths. Static activation
scales (``input_scale``) are read past: activations are quantized per row at run time instead.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from worker.models.base import WeightTarget
from worker.models.module_walk import named_linears

log = logging.getLogger(__name__)
FP8 = torch.float8_e4m3fn
SCALE_SUFFIX = ".weight_scale"
# The quantization_config of a compressed-tensors checkpoint of per-channel e4m3 weights and
# dynamic per-token activations (what llm-compressor's FP8_DYNAMIC scheme writes), the LM head
# left float: one layout `check_fp8_config` accepts, and the one ops/bench/random_model.py writes.
COMPRESSED_TENSORS_FP8: dict[str, Any] = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
            "input_activations": {"num_bits": 8, "type": "float", "dynamic": True},
        }
    },
    "ignore": ["lm_head"],
}
IGNORED_SUFFIXES = (".input_scale", ".weight_zero_point", ".input_zero_point")


def check_fp8_config(quantization_config: dict[str, Any]) -> None:
    """ValueError unless ``quantization_config`` describes e4m3 weights with per-tensor or
    per-channel scales."""
    method = quantization_config.get("quant_method")
    if method == "fbgemm_fp8":
        return
    if method == "fp8":
        raise ValueError(
            "FP8 checkpoint with block-wise scales (quant_method fp8, weight_block_size "
            f"{quantization_config.get('weight_block_size')}): only per-tensor or per-channel "
            "weight_scale is supported"
        )
    if method != "compressed-tensors":
        raise ValueError(f"quantization_config quant_method {method!r} is not supported")
    for name, group in (quantization_config.get("config_groups") or {}).items():
        weights = group.get("weights") or {}
        kind = (weights.get("type"), weights.get("num_bits"), weights.get("strategy"))
        if kind[:2] != ("float", 8) or kind[2] not in ("tensor", "channel"):
            raise ValueError(
                f"compressed-tensors group {name!r}: weights {kind[0]} {kind[1]}-bit with "
                f"{kind[2]} scales; only 8-bit float with tensor or channel scales is supported"
            )


class Fp8Checkpoint:
    """The FP8 codes and scales of a checkpoint's projections, gathered while it loads."""

    def __init__(self, scales: dict[str, torch.Tensor]) -> None:
        self.scales = scales  # HF weight name -> its weight_scale
        self.codes: dict[str, torch.Tensor] = {}  # our parameter name -> (N, K) e4m3
        self.row_scales: dict[str, torch.Tensor] = {}  # our parameter name -> (N,) float32
        self.filled: dict[str, int] = {}  # rows of codes taken so far

    @classmethod
    def of(cls, model_dir: Path) -> Fp8Checkpoint | None:
        """The checkpoint's FP8 state if its config.json declares FP8 weights, else None."""
        import json

        from safetensors import safe_open

        raw = json.loads((model_dir / "config.json").read_text())
        quantization_config = raw.get("quantization_config")
        if not quantization_config:
            return None
        check_fp8_config(quantization_config)
        scales = {}
        for file in sorted(model_dir.glob("*.safetensors")):  # scales may sit in any shard
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    if name.endswith(SCALE_SUFFIX):
                        weight = name.removesuffix(SCALE_SUFFIX) + ".weight"
                        scales[weight] = f.get_tensor(name).float()
        return cls(scales)

    @staticmethod
    def skips(hf_name: str) -> bool:
        """Whether ``hf_name`` is a scale (read in `of`) rather than a tensor to load."""
        return hf_name.endswith((SCALE_SUFFIX, *IGNORED_SUFFIXES))

    def take(
        self, hf_name: str, tensor: torch.Tensor, target: WeightTarget, rows: int
    ) -> torch.Tensor:
        """``tensor`` as the float values to load; an FP8 one is dequantized and its codes and
        per-row scales kept for rows ``target.start..`` of a parameter of ``rows`` rows."""
        if tensor.dtype != FP8:
            return tensor
        if hf_name not in self.scales:
            raise ValueError(f"{hf_name} is float8_e4m3fn but has no weight_scale")
        scale = self.scales[hf_name].reshape(-1)
        n = tensor.shape[0]
        if scale.numel() not in (1, n):
            raise ValueError(
                f"{hf_name}: weight_scale of {scale.numel()} values for {n} rows (only "
                "per-tensor or per-channel scales are supported)"
            )
        scale = scale.expand(n)
        codes = self.codes.setdefault(target.name, torch.empty(rows, tensor.shape[1], dtype=FP8))
        row_scales = self.row_scales.setdefault(target.name, torch.empty(rows))
        codes[target.start : target.start + n] = tensor
        row_scales[target.start : target.start + n] = scale
        self.filled[target.name] = self.filled.get(target.name, 0) + n
        return tensor.float() * scale[:, None]

    def complete(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Codes and scales of every parameter whose rows all came as FP8, by parameter name."""
        return {
            name: (codes, self.row_scales[name])
            for name, codes in self.codes.items()
            if self.filled[name] == codes.shape[0]
        }

    def apply(self, model: nn.Module, device: torch.device, quantization: str) -> int:
        """Swap in `Fp8Linear` where the device runs FP8 and ``quantization`` is ``auto``;
        how many projections were swapped (0: the dequantized weights stay)."""
        from kernels.triton_quant import fp8_supported

        if quantization != "auto" or device.type != "cuda" or not fp8_supported(device):
            log.info("FP8 checkpoint dequantized to %s on %s", _dtype(model), device)
            return 0
        return swap_fp8(model, self.complete(), device)


def _dtype(model: nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def swap_fp8(
    model: nn.Module, weights: dict[str, tuple[torch.Tensor, torch.Tensor]], device: torch.device
) -> int:
    """Replace each `nn.Linear` whose ``<name>.weight`` is in ``weights`` by an `Fp8Linear`."""
    swapped = 0
    for name, (parent, attr, child) in named_linears(model).items():
        if f"{name}.weight" in weights:
            codes, scale = weights[f"{name}.weight"]
            setattr(parent, attr, Fp8Linear(codes.to(device), scale.to(device), child.bias))
            swapped += 1
    return swapped


class Fp8Linear(nn.Module):
    """``y = x @ (scale[:, None] * W).T + b`` with ``W`` e4m3 codes ``(N, K)``, in ``x``'s
    dtype: kernels/triton_quant.py's weight-only `w8_linear` up to ``WEIGHT_ONLY_MAX_ROWS``
    rows, ``torch._scaled_mm`` (`fp8_linear`, activations to e4m3 per row) beyond."""

    weight: torch.Tensor
    scale: torch.Tensor

    def __init__(
        self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
    ) -> None:
        super().__init__()
        if weight.dtype != FP8 or scale.shape != (weight.shape[0],):
            raise ValueError("Fp8Linear takes e4m3 (N, K) codes and (N,) scales")
        self.register_buffer("weight", weight.contiguous(), persistent=False)
        self.register_buffer("scale", scale.float(), persistent=False)
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else nn.Parameter(bias.detach(), False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from kernels.triton_quant import WEIGHT_ONLY_MAX_ROWS, fp8_linear, w8_linear

        x2 = x.reshape(-1, self.in_features).contiguous()
        if x2.shape[0] <= WEIGHT_ONLY_MAX_ROWS:  # decode steps: the weight's bytes decide
            out = w8_linear(x2, self.weight, self.scale, self.bias)
        else:
            out = fp8_linear(x2, self.weight, self.scale, self.bias)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format=fp8"
