"""Large logits go into a buffer kept across steps; the values are the model's own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import write_tiny_llama
from tests.engine.test_engine import PROMPTS, make_engine
from tests.engine.test_input_batch import tiny_config
from worker.engine import logits_buffer
from worker.engine.logits_buffer import LogitsBuffer
from worker.engine.sampling_params import SamplingParams
from worker.models.llama import LlamaForCausalLM


def tiny_model() -> LlamaForCausalLM:
    config = tiny_config(tie=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.normal_()
    return model


@torch.inference_mode()
def test_large_logits_reuse_one_buffer_with_the_models_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = tiny_model()
    logits = LogitsBuffer(model)
    hidden = torch.randn(6, 8)
    small = logits(hidden)
    assert torch.equal(small, model.compute_logits(hidden))
    monkeypatch.setattr(logits_buffer, "MIN_BYTES", 0)  # every size is large now
    first = logits(hidden)
    assert torch.equal(first, model.compute_logits(hidden))
    address = first.data_ptr()
    del first
    second = logits(hidden[:4])  # fewer rows: the same buffer's first rows
    assert second.data_ptr() == address
    assert torch.equal(second, model.compute_logits(hidden[:4]))


@torch.inference_mode()
def test_logits_still_held_are_not_overwritten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logits_buffer, "MIN_BYTES", 0)
    model = tiny_model()
    logits = LogitsBuffer(model)
    a, b = torch.randn(5, 8), torch.randn(5, 8)
    held = logits(a)
    later = logits(b)
    assert held.data_ptr() != later.data_ptr()
    assert torch.equal(held, model.compute_logits(a))
    assert torch.equal(later, model.compute_logits(b))


@torch.inference_mode()
def test_a_model_with_its_own_logits_keeps_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logits_buffer, "MIN_BYTES", 0)

    class Scaled(LlamaForCausalLM):
        def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
            return 2 * super().compute_logits(hidden)

    model = tiny_model()
    scaled = Scaled(model.config)
    scaled.load_state_dict(model.state_dict())
    hidden = torch.randn(3, 8)
    assert torch.equal(LogitsBuffer(scaled)(hidden), 2 * model.compute_logits(hidden))


def test_engine_tokens_are_the_same_with_the_buffer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, smol_model_dir: Path
) -> None:
    """Greedy and seeded tokens of a batch, every logits tensor in the buffer or none."""
    model_dir = write_tiny_llama(tmp_path / "untied", smol_model_dir, tie=False)
    params = [
        SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
        SamplingParams(temperature=0.9, top_p=0.9, seed=3, max_tokens=10, ignore_eos=True),
    ]
    runs = []
    for min_bytes in (1 << 60, 0):
        monkeypatch.setattr(logits_buffer, "MIN_BYTES", min_bytes)
        engine = make_engine(model_dir)
        outs = engine.generate(PROMPTS, [params[i % 2] for i in range(len(PROMPTS))])
        runs.append([o.token_ids for o in outs])
        assert (engine.runner.compute_logits._buffer is not None) == (min_bytes == 0)
    assert runs[0] == runs[1]
