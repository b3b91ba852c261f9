"""Exact greedy parity with HF on the bundled SmolLM2-135M through the padded static path.

The workload of `test_parity_hf` (one continuous batch, staggered arrivals, 4-token blocks,
chunked prefill, preemption), with decode steps padded to graph sizes and run from the static
buffers, as a CUDA engine runs them, but without capture.
"""

from __future__ import annotations

import pytest

from tests.engine.test_padded_decode import PrepareSpy
from tests.engine.test_parity_hf import (
    MAX_NEW_TOKENS,
    PROMPTS,
    HFRun,
    assert_parity,
    hf_runs,
)
from worker.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow
__all__ = ["hf_runs"]  # the fixture, shared


def test_greedy_parity_through_padded_static_decode_steps(hf_runs: list[HFRun]) -> None:
    engine = LLMEngine(
        EngineConfig(
            attention_backend="cpu",
            pad_decode_batches=True,
            cache=CacheConfig(block_size=4, num_blocks=70),
            scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=32),
        )
    )
    assert engine.runner.inputs is not None and engine.runner.pad_sizes == (1, 2, 4, 8)
    spy = PrepareSpy(engine)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS)
    tokens: dict[str, list[int]] = {}
    arrival = {i: 0 if i < 3 else 2 * (i - 2) for i in range(len(PROMPTS))}
    step = 0
    while len(tokens) < len(PROMPTS) or engine.has_unfinished():
        for i in [i for i, at in arrival.items() if at == step]:
            engine.add_prompt(f"p{i}", PROMPTS[i], params)
            tokens[f"p{i}"] = []
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
        step += 1
    assert engine.scheduler.num_preemptions >= 1
    assert any(s.meta.num_padding for s in spy.steps)
    verdicts = [
        assert_parity(tokens[f"p{i}"], hf_runs[i], PROMPTS[i][:20]) for i in range(len(PROMPTS))
    ]
    print("parity verdicts:", verdicts)
    assert verdicts.count("exact") >= len(PROMPTS) - 1, verdicts
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
