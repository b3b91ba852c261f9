"""Our decoder against Hugging Face transformers on tiny random checkpoints of each family."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from worker.attention.backend import BackendName
from worker.attention.cpu_backend import CpuAttentionBackend
from worker.engine.config import CacheConfig, EngineConfig
from worker.engine.model_runner import ModelRunner
from worker.engine.scheduler_output import ScheduledSequence, SchedulerOutput
from worker.models.config import ModelConfig, UnsupportedModelError
from worker.models.cpu_kernels import use_cpu_kernels
from worker.models.loader import load_model

BASE: dict[str, Any] = dict(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=80,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=256,
)

FAMILIES: dict[str, dict[str, Any]] = {
    "llama": dict(model_type="llama", tie_word_embeddings=True),
    "llama3-rope": dict(
        model_type="llama",
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=32,
        ),
        rope_theta=500000.0,
    ),
    "llama-bias": dict(model_type="llama", attention_bias=True, mlp_bias=True),
    "mistral": dict(model_type="mistral", sliding_window=None),
    "qwen2": dict(model_type="qwen2"),
    "qwen3": dict(model_type="qwen3", head_dim=16),
    # As Qwen3-0.6B: tied embeddings, rope theta 1e6 (head_dim 16 where hidden / heads is 8).
    "qwen3-tied": dict(model_type="qwen3", head_dim=16, tie_word_embeddings=True, rope_theta=1e6),
}


def save_tiny(tmp: Path, family: str) -> Path:
    spec = dict(FAMILIES[family])
    model_type = spec.pop("model_type")
    config = AutoConfig.for_model(model_type, **BASE, **spec)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # biases and norms start at 0/1: randomise so they are really tested
        for name, p in model.named_parameters():
            if "bias" in name or "norm" in name:
                p.normal_(0.5 if "norm" in name else 0.0, 0.2)
    model.save_pretrained(tmp)
    return tmp


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_packed_paged_forward_matches_transformers(
    tmp_path: Path, family: str, backend: BackendName
) -> None:
    """Through torch's path, and through our C++ kernels (attention and the fused layer ops)."""
    model_dir = save_tiny(tmp_path, family)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ours = load_model(model_dir, torch.float32, torch.device("cpu"))
    config = EngineConfig(cache=CacheConfig(block_size=4, num_blocks=40), attention_backend=backend)
    runner = ModelRunner(config, ours, torch.device("cpu"))
    if backend == "cpu":
        assert isinstance(runner.backend, CpuAttentionBackend)
        assert use_cpu_kernels(ours, runner.backend.ops) >= 9  # qwen3 adds q/k norms
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (1, 9, 23)]
    # Scattered, non-contiguous block tables.
    tables = [(39,), (5, 17, 2), (30, 1, 12, 25, 8, 3)]
    items = tuple(
        ScheduledSequence(f"s{i}", tuple(p), 0, t, True)
        for i, (p, t) in enumerate(zip(prompts, tables, strict=True))
    )
    out = runner.run(SchedulerOutput(items, sum(len(p) for p in prompts), ()))
    # Then a decode step and a chunk over the cached prefix, mixed in one batch.
    assert out.request_ids == ("s0", "s1", "s2")
    nxt = [int(t) for t in out.logits.argmax(-1)]
    step2 = (
        ScheduledSequence("s0", (nxt[0],), 1, tables[0], True),
        ScheduledSequence("s1", (nxt[1],), 9, tables[1], True),
        ScheduledSequence("s2", (nxt[2],), 23, tables[2], True),
    )
    out2 = runner.run(SchedulerOutput(step2, 3, ()))
    assert out2.request_ids == ("s2", "s1", "s0")  # decodes packed longest first
    # The runner may reorder rows (decodes longest first): map them back by request id.
    row2 = {rid: i for i, rid in enumerate(out2.request_ids)}
    with torch.no_grad():
        for i, p in enumerate(prompts):
            ref = hf(torch.tensor([[*p, nxt[i]]])).logits[0]
            torch.testing.assert_close(out.logits[i], ref[-2], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(out2.logits[row2[f"s{i}"]], ref[-1], rtol=1e-4, atol=1e-4)


def test_config_reads_rope_from_both_transformers_layouts() -> None:
    old = dict(
        BASE, model_type="llama", rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0}
    )
    new = dict(
        BASE,
        model_type="llama",
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5},
    )
    assert ModelConfig.from_hf(old).rope == ModelConfig.from_hf(new).rope
    assert ModelConfig.from_hf(old).rope.kind == "linear"


def test_unsupported_architecture_is_a_clear_error() -> None:
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        ModelConfig.from_hf(dict(BASE, model_type="gpt2"))
