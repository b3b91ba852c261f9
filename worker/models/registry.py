"""The architectures we implement, by the checkpoint's ``model_type``, and what sets each apart.

The one list of supported architectures: `ModelConfig.from_hf` refuses any other, and the loader
builds the class named here. Classes are named as ``module:Class`` and imported on first use, so
this module (imported by the config) imports no model code.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker.models.base import CausalLM


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture is not one this decoder implements."""


@dataclass(frozen=True)
class Architecture:
    """One checkpoint family: the class that runs it and the switches its config implies."""

    model_class: str  # "module:Class", a `CausalLM`
    # q/k/v projections always carry a bias and o_proj never does (Qwen2); elsewhere the
    # config's attention_bias puts one on all four.
    qkv_bias: bool = False
    qk_norm: bool = False  # an RMSNorm over each q and k head before rotary (Qwen3)


_LLAMA = "worker.models.llama:LlamaForCausalLM"
ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(_LLAMA),
    "mistral": Architecture(_LLAMA),
    "qwen2": Architecture(_LLAMA, qkv_bias=True),
    "qwen3": Architecture(_LLAMA, qk_norm=True),
}


def architecture(model_type: str) -> Architecture:
    """The registered family of ``model_type``; a clear error naming the supported ones."""
    found = ARCHITECTURES.get(model_type)
    if found is None:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported; expected one of "
            f"{', '.join(ARCHITECTURES)}"
        )
    return found


def model_class(model_type: str) -> type[CausalLM]:
    """The `CausalLM` subclass that runs ``model_type`` checkpoints."""
    module_name, _, class_name = architecture(model_type).model_class.partition(":")
    cls: type[CausalLM] = getattr(importlib.import_module(module_name), class_name)
    return cls
