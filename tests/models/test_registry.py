"""The architecture registry decides the class the loader builds; backends bring their kernels."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tests.models.test_architectures import save_tiny
from worker.attention import KernelCounts, get_attention_backend
from worker.models import registry
from worker.models.config import ModelConfig, UnsupportedModelError
from worker.models.cpu_linear import onednn_supports
from worker.models.llama import LlamaForCausalLM
from worker.models.loader import load_model


class TaggedLlama(LlamaForCausalLM):
    """A registered stand-in: the loader must build whatever the registry names."""


def test_every_supported_family_resolves_to_a_class() -> None:
    for model_type in ("llama", "mistral", "qwen2", "qwen3"):
        assert registry.model_class(model_type) is LlamaForCausalLM


def test_an_unknown_architecture_names_the_supported_ones() -> None:
    with pytest.raises(UnsupportedModelError, match=r"'gpt2'.*llama, mistral, qwen2, qwen3"):
        registry.model_class("gpt2")


def test_the_loader_builds_the_registered_class(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = save_tiny(tmp_path, "qwen2")
    entry = registry.Architecture(f"{__name__}:TaggedLlama", qkv_bias=True)
    monkeypatch.setitem(registry.ARCHITECTURES, "qwen2", entry)
    model = load_model(model_dir, torch.float32, torch.device("cpu"))
    assert type(model) is TaggedLlama
    assert model.config.qkv_bias and not model.config.o_bias  # the entry's switches applied


def test_family_switches_come_from_the_registry() -> None:
    raw = dict(
        vocab_size=97,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=1,
        num_attention_heads=6,
        attention_bias=True,
    )
    llama = ModelConfig.from_hf(dict(raw, model_type="llama"))
    qwen2 = ModelConfig.from_hf(dict(raw, model_type="qwen2"))
    qwen3 = ModelConfig.from_hf(dict(raw, model_type="qwen3"))
    assert (llama.qkv_bias, llama.o_bias, llama.qk_norm) == (True, True, False)
    assert (qwen2.qkv_bias, qwen2.o_bias, qwen2.qk_norm) == (True, False, False)
    assert (qwen3.qkv_bias, qwen3.o_bias, qwen3.qk_norm) == (True, True, True)


def test_the_torch_backend_packs_linears_and_fuses_nothing(tmp_path: Path) -> None:
    model = load_model(save_tiny(tmp_path, "llama"), torch.float32, torch.device("cpu"))
    linears = sum(type(m) is nn.Linear for m in model.modules())
    backend = get_attention_backend("torch", torch.device("cpu"))
    counts = backend.install_kernels(model, "auto")
    packs = onednn_supports(torch.float32)
    assert counts == KernelCounts(packed_linears=linears if packs else 0, fused_modules=0)
    assert all(m.cpu_ops is None for m in model.modules() if hasattr(m, "cpu_ops"))
