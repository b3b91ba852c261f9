"""``--quantization``: swap a loaded model's float projections for quantized ones.

- ``gguf``: the GGUF file's own Q8_0/Q4_0/Q4_1 blocks, read again from the file (the model was
  filled from its dequantized copy). HF's separate q/k/v and gate/up become our fused rows by
  concatenating whole rows of blocks, which is exact; llama.cpp stores q and k of Llama models
  with their rows permuted for its rotary layout, and a permutation of rows is exact too. Every
  swapped weight is checked to dequantize exactly to the float weight it replaces (on its first
  128 and last 64 rows, `_same`), so no name or row order can go wrong silently. Tensors in
  other types (F32, F16, k-quants) stay float.
- ``int8``: per-channel symmetric int8 made from the float weights (any checkpoint); on CUDA
  through a Triton GEMM (worker/models/quant_cuda.py), elsewhere the CPU's C++ kernels.
- ``auto``: ``gguf`` when the model is a GGUF holding blocks we run and the model runs in
  float32 on the CPU; else ``none``, the float weights as loaded (exact HF parity).

Tied embeddings: the embedding table and the LM head share one quantized table; the lookup
dequantizes the rows it needs (`QuantEmbedding`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from kernels import quant_reference as qr
from worker.models.base import CausalLM
from worker.models.config import ModelConfig
from worker.models.module_walk import named_linears
from worker.models.quant import QuantWeight, attach
from worker.models.quant_gguf import GGUFTensor, read_tensors
from worker.models.quant_layers import QuantEmbedding, QuantLinear

log = logging.getLogger(__name__)
MODES = ("auto", "none", "gguf", "int8")  # EngineConfig.quantization's values
Dequantize = Callable[[torch.Tensor, int], torch.Tensor]


def quantize_model(
    model: CausalLM,
    mode: str,
    gguf_file: Path | None,
    device: torch.device,
    activations: str = "float32",
) -> str:
    """Apply ``mode`` to ``model`` in place, its GGUF blocks taking ``activations``
    (`EngineConfig.quant_activations`); the mode applied (``auto`` resolved)."""
    if mode not in MODES:
        raise ValueError(f"unknown quantization {mode!r}; expected one of {', '.join(MODES)}")
    # Refused before anything is swapped: int8 and none up front, auto once it found no blocks.
    if activations != "float32" and mode in ("none", "int8"):
        raise _needs_blocks(activations, mode)
    applied = _quantize(model, mode, gguf_file, device, activations)
    if activations != "float32" and applied != "gguf":
        raise _needs_blocks(activations, applied)
    return applied


def _needs_blocks(activations: str, mode: str) -> ValueError:
    return ValueError(
        f"--quant-activations {activations} needs GGUF blocks (--quantization gguf on a "
        f"quantized .gguf, float32 on the CPU); this model runs --quantization {mode}"
    )


def _quantize(
    model: CausalLM, mode: str, gguf_file: Path | None, device: torch.device, activations: str
) -> str:
    cpu_fp32 = device.type == "cpu" and model.dtype == torch.float32
    if mode == "none" or (mode == "auto" and not (cpu_fp32 and gguf_file is not None)):
        return "none"
    if device.type == "cuda" and mode == "int8" and activations == "float32":
        from worker.models.quant_cuda import to_int8

        log.info("int8 weights on %s: %d projections", device, to_int8(model))
        return mode
    if device.type != "cpu":
        raise ValueError(f"--quantization {mode} runs on the CPU only (device {device})")
    from kernels import cpu_ops

    ops = cpu_ops.load()
    if mode == "int8":
        _to_int8(model)
    elif gguf_file is None:
        raise ValueError("--quantization gguf needs a .gguf model")
    else:
        dequantize = ops.gguf_dequantize if ops is not None else qr.dequantize
        if not _to_gguf(model, gguf_file, dequantize):
            if mode == "auto":
                return "none"
            raise ValueError(f"{gguf_file.name} holds no Q8_0, Q4_0 or Q4_1 projections")
        mode = "gguf"
    attach(model, ops, activations)
    return mode


def _embedding(model: nn.Module) -> nn.Embedding:
    embed = getattr(model, "embed_tokens", None)
    if not isinstance(embed, nn.Embedding):
        raise ValueError(f"{type(model).__name__} has no embed_tokens embedding to quantize")
    return embed


def _is_tied(model: nn.Module) -> bool:
    head = getattr(model, "lm_head", None)
    return isinstance(head, nn.Linear) and head.weight is _embedding(model).weight


def replace_weights(model: nn.Module, weights: dict[str, QuantWeight]) -> None:
    """Swap in `QuantLinear`/`QuantEmbedding` where ``weights`` has the module's name."""
    embed = _embedding(model)
    tied = _is_tied(model)
    if "embed_tokens" in weights:
        model.embed_tokens = QuantEmbedding(weights["embed_tokens"], embed.weight.dtype)
        if tied:
            weights.setdefault("lm_head", weights["embed_tokens"])
    for name, (parent, attr, linear) in named_linears(model).items():
        if name in weights:
            setattr(parent, attr, QuantLinear(weights[name], linear.bias))


def _to_int8(model: CausalLM) -> None:
    weights = {}
    for name, (_, _, linear) in named_linears(model).items():
        q, scale = qr.quantize_int8(linear.weight)
        weights[name] = QuantWeight(q, None, scale)
    if _is_tied(model):  # tied: the head's per-row int8 is the table's too
        weights["embed_tokens"] = weights["lm_head"]
    replace_weights(model, weights)


def _to_gguf(model: CausalLM, gguf_file: Path, dequantize: Dequantize) -> int:
    """Swap every projection the file holds in a block format; how many were swapped."""
    tensors = read_tensors(gguf_file)
    floats = {name: linear.weight for name, (_, _, linear) in named_linears(model).items()}
    floats["embed_tokens"] = _embedding(model).weight
    c = model.config
    heads = {"attn_q": c.num_q_heads, "attn_k": c.num_kv_heads}
    weights: dict[str, QuantWeight] = {}
    for ours, parts in _gguf_parts(c, floats).items():
        found = [tensors.get(part) for part in parts]
        blocks = _matching_blocks(found, floats[ours], heads, dequantize)
        if blocks is not None:
            weights[ours] = QuantWeight(blocks, parts_type(found))
    replace_weights(model, weights)
    return len(weights)


def _gguf_parts(config: ModelConfig, floats: dict[str, torch.Tensor]) -> dict[str, list[str]]:
    """Our module names -> the GGUF tensors whose rows, in order, make their weight."""
    parts: dict[str, list[str]] = {"embed_tokens": ["token_embd.weight"]}
    if "lm_head" in floats and floats["lm_head"] is not floats["embed_tokens"]:
        parts["lm_head"] = ["output.weight"]
    for i in range(config.num_layers):
        b, ours = f"blk.{i}.", f"layers.{i}."
        parts[ours + "self_attn.qkv_proj"] = [
            b + "attn_q.weight",
            b + "attn_k.weight",
            b + "attn_v.weight",
        ]
        parts[ours + "self_attn.o_proj"] = [b + "attn_output.weight"]
        parts[ours + "mlp.gate_up_proj"] = [b + "ffn_gate.weight", b + "ffn_up.weight"]
        parts[ours + "mlp.down_proj"] = [b + "ffn_down.weight"]
    return {name: p for name, p in parts.items() if name in floats}


def parts_type(found: list[GGUFTensor | None]) -> int:
    """The one block format of all ``found`` parts; -1 if one is missing or they differ."""
    types = {t.type_id if t is not None else -1 for t in found}
    return types.pop() if len(types) == 1 else -1


def _matching_blocks(
    found: list[GGUFTensor | None],
    weight: torch.Tensor,
    heads: dict[str, int],
    dequantize: Dequantize,
) -> torch.Tensor | None:
    """The concatenated blocks of ``found`` (in each part's row order that reproduces
    ``weight`` exactly), or None: a part missing, in another format, or matching no order."""
    type_id = parts_type(found)
    if type_id not in qr.FORMATS:
        return None
    blocks, start = [], 0
    for tensor in found:
        assert tensor is not None
        data = torch.from_numpy(tensor.data.copy())
        rows = weight[start : start + data.shape[0]].detach()
        start += data.shape[0]
        kind = tensor.name.split(".")[-2]  # blk.3.attn_q.weight -> attn_q
        ordered = _row_order(data, type_id, rows, heads.get(kind), dequantize)
        if ordered is None:
            log.warning("%s does not dequantize to the loaded weight; kept float", tensor.name)
            return None
        blocks.append(ordered)
    return torch.cat(blocks) if start == weight.shape[0] else None


def _row_order(
    data: torch.Tensor, type_id: int, rows: torch.Tensor, heads: int | None, dequantize: Dequantize
) -> torch.Tensor | None:
    """``data`` as is or, for q and k (``heads`` given), with llama.cpp's rotary row permutation
    undone (as transformers undoes it), whichever dequantizes to ``rows``; None if neither."""
    if data.shape[0] != rows.shape[0]:
        return None
    if _same(data, type_id, rows, dequantize):
        return data
    if heads is None or data.shape[0] % (2 * heads):
        return None
    dim = data.shape[0] // heads // 2
    order = torch.arange(data.shape[0]).reshape(heads, dim, 2).transpose(1, 2).reshape(-1)
    permuted = data[order].contiguous()
    return permuted if _same(permuted, type_id, rows, dequantize) else None


def _same(data: torch.Tensor, type_id: int, rows: torch.Tensor, dequantize: Dequantize) -> bool:
    """Whether ``data`` dequantizes exactly to ``rows``, checked on the first 128 and last 64
    rows: a wrong tensor or row order shows in any head's rows, and checking all of them (the
    49,152-row embedding too) took 4 of a load's 7 s of CPU on our 2 cores."""
    n = data.shape[0]
    sample = torch.cat((torch.arange(min(n, 128)), torch.arange(max(0, n - 64), n))).unique()
    return torch.equal(dequantize(data[sample].contiguous(), type_id), rows[sample].float())
