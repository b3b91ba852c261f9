"""The decoder's architecture, read once from a Hugging Face ``config.json``."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from worker.models.registry import UnsupportedModelError, architecture

__all__ = ["ModelConfig", "RopeConfig", "UnsupportedModelError"]


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    kind: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    def inv_freq(self, head_size: int) -> torch.Tensor:
        """Per-pair inverse frequencies ``(head_size // 2,)`` in float32, as HF computes them."""
        exponents = torch.arange(0, head_size, 2, dtype=torch.int64).float() / head_size
        inv = 1.0 / (self.theta**exponents)
        if self.kind == "linear":
            return inv / self.factor
        if self.kind == "llama3":
            return self._llama3(inv)
        return inv

    def _llama3(self, inv: torch.Tensor) -> torch.Tensor:
        # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between
        # interpolated, so the model extends from 8k to 128k context without retraining.
        low_wavelen = self.original_max_position / self.low_freq_factor
        high_wavelen = self.original_max_position / self.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / self.factor, inv)
        smooth = (self.original_max_position / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled)


@dataclass(frozen=True)
class ModelConfig:
    """Everything the decoder needs; derived values are properties, never stored twice."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_size: int
    rms_norm_eps: float
    max_position: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    rope: RopeConfig
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of all layers for one token, in float32 units of 4 bytes (scale by dtype)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_size

    @classmethod
    def from_dir(cls, model_dir: Path) -> ModelConfig:
        raw = json.loads((model_dir / "config.json").read_text())
        return cls.from_hf(raw)

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> ModelConfig:
        model_type = raw.get("model_type", "")
        family = architecture(model_type)
        _check_full_attention(raw)
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            model_type=model_type,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_q_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_size=int(raw.get("head_dim") or hidden // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position=int(raw.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            # Llama-style configs say attention_bias, which covers o_proj too (`Architecture`).
            qkv_bias=family.qkv_bias or bool(raw.get("attention_bias", False)),
            o_bias=not family.qkv_bias and bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=family.qk_norm,
            rope=_rope_from_hf(raw),
            eos_token_ids=eos_ids,
            bos_token_id=raw.get("bos_token_id"),
        )


def _check_full_attention(raw: dict[str, Any]) -> None:
    """Refuse Qwen2/Qwen3 checkpoints whose layers use sliding-window attention: every layer of
    ours attends to the whole context, so their tokens would differ past the window."""
    layers = int(raw.get("num_hidden_layers", 0))
    # transformers 5 writes the per-layer kinds; 4.x configs only say where the windows start.
    kinds = raw.get("layer_types")
    if kinds is None and raw.get("use_sliding_window"):
        first_windowed = int(raw.get("max_window_layers", layers))
        kinds = ["sliding_attention"] * max(0, layers - first_windowed)
    if kinds and "sliding_attention" in kinds:
        raise UnsupportedModelError(
            f"sliding-window attention (use_sliding_window, {kinds.count('sliding_attention')} "
            f"of {layers} layers) is not supported; only full attention is"
        )


def _rope_from_hf(raw: dict[str, Any]) -> RopeConfig:
    # transformers 5 nests theta and scaling in `rope_parameters`; 4.x: rope_theta + rope_scaling.
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind not in ("default", "linear", "llama3"):
        raise UnsupportedModelError(f"rope scaling {kind!r} is not supported")
    return RopeConfig(
        theta=theta,
        kind=kind,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=int(params.get("original_max_position_embeddings", 8192)),
    )
