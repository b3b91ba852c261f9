"""Qwen3 in our decoder: its config.json read right, and greedy tokens equal to Hugging Face's
Qwen3ForCausalLM through the whole engine (chunked prefill, a continuous batch, both backends)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tests.models.test_architectures import BASE, FAMILIES
from worker.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine.sampling_params import SamplingParams
from worker.models.config import ModelConfig, UnsupportedModelError

# The keys of Qwen/Qwen3-0.6B's config.json that the decoder reads (transformers 4.51 layout).
QWEN3_06B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
PROMPT_LENS = (1, 9, 23, 40)  # 40 > the 16-token step budget: its prefill is chunked
MAX_TOKENS = 12


def test_qwen3_0_6b_config() -> None:
    mc = ModelConfig.from_hf(QWEN3_06B)
    assert mc.model_type == "qwen3" and mc.qk_norm and mc.tie_word_embeddings
    assert (mc.num_q_heads, mc.num_kv_heads, mc.head_size) == (16, 8, 128)  # not 1024 / 16
    assert not (mc.qkv_bias or mc.o_bias or mc.mlp_bias)
    assert mc.rope.theta == 1e6 and mc.rope.kind == "default"
    assert mc.eos_token_ids == (151645,) and mc.max_position == 40960


def test_sliding_window_layers_are_refused() -> None:
    windowed = dict(QWEN3_06B, use_sliding_window=True, max_window_layers=20)
    with pytest.raises(UnsupportedModelError, match="8 of 28 layers"):
        ModelConfig.from_hf(windowed)
    layered = dict(QWEN3_06B, layer_types=["full_attention"] * 27 + ["sliding_attention"])
    with pytest.raises(UnsupportedModelError, match="sliding-window"):
        ModelConfig.from_hf(layered)
    # Windows that start past the last layer are no windows: Qwen2.5 ships such configs.
    assert ModelConfig.from_hf(dict(QWEN3_06B, use_sliding_window=True, max_window_layers=28))


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory, smol_model_dir: Path) -> Path:
    """A tiny tied Qwen3 whose layers, not its embeddings, decide the next token, and SmolLM2's
    tokenizer files for the engine.

    With N(0, 1) embeddings (the tests' tiny Llama) a tied model echoes its last input token:
    48 of 48 greedy tokens here, and the same tokens with rotary switched off, so the check
    would prove nothing. Embeddings of N(0, 0.3) and projections of twice the 1/sqrt(fan_in)
    scale echo 4 of 48, a model without rotary changes all 4 outputs, and the top-2 logit gap
    stays >= 0.02 (fp32 differences are ~1e-5)."""
    spec = dict(FAMILIES["qwen3-tied"])
    config = AutoConfig.for_model(spec.pop("model_type"), **BASE, **spec)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.2)
            elif p.dim() == 2 and "embed" not in name:
                p.normal_(0.0, 2 * p.shape[1] ** -0.5)
        model.get_input_embeddings().weight.normal_(0.0, 0.3)
    out = tmp_path_factory.mktemp("tiny-qwen3")
    model.save_pretrained(out)
    for path in smol_model_dir.iterdir():
        if path.name != "config.json" and path.suffix != ".safetensors":
            shutil.copy(path, out / path.name)
    return out


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, BASE["vocab_size"], (n,), generator=gen).tolist() for n in PROMPT_LENS]


def hf_greedy(model_dir: Path) -> list[tuple[list[int], list[torch.Tensor]]]:
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen3ForCausalLM"
    hf.generation_config.eos_token_id = None  # as ignore_eos: nothing stops, nothing is masked
    runs = []
    for p in prompts():
        ids = torch.tensor([p])
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=MAX_TOKENS,
            min_new_tokens=MAX_TOKENS,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
        runs.append((out.sequences[0, len(p) :].tolist(), [lg[0] for lg in out.logits]))
    return runs


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_greedy_tokens_equal_transformers_qwen3(qwen3_dir: Path, backend: str) -> None:
    """Through torch's path, and through our C++ kernels (attention and the fused layer ops,
    which leave Qwen3's q/k norms and their rotary to torch)."""
    engine = LLMEngine(
        EngineConfig(
            model=str(qwen3_dir),
            device="cpu",
            attention_backend=backend,  # type: ignore[arg-type]
            cache=CacheConfig(block_size=4, num_blocks=64),
            scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16),
        )
    )
    assert engine.model_config.qk_norm and engine.model_config.head_size == 16
    assert (engine.num_fused_modules > 0) == (backend == "cpu")
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    tokens: dict[str, list[int]] = {}
    for i, p in enumerate(prompts()):
        engine.add_prompt(f"q{i}", params=params, prompt_token_ids=p)
        tokens[f"q{i}"] = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
    echoes = 0  # tokens that repeat the one before them
    for i, (expected, logits) in enumerate(hf_greedy(qwen3_dir)):
        ours = tokens[f"q{i}"]
        gaps = [float(lg.topk(2).values.diff().abs()) for lg in logits]
        assert min(gaps) > 1e-3, f"prompt {i}: an HF near-tie would make the check meaningless"
        assert ours == expected, f"prompt {i} ({PROMPT_LENS[i]} tokens): {ours} != HF {expected}"
        echoes += sum(a == b for a, b in zip(ours, [prompts()[i][-1], *ours], strict=False))
    assert echoes < len(PROMPT_LENS) * MAX_TOKENS // 4  # the layers decide, not the embedding
