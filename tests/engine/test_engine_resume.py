"""Resuming a request from the tokens an earlier run streamed (a worker that died mid-decode)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.test_engine import PROMPTS, make_engine
from worker.engine.llm_engine import LLMEngine
from worker.engine.outputs import RequestOutput
from worker.engine.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> LLMEngine:
    return make_engine(tiny_model_dir)


def run(
    engine: LLMEngine, rid: str, prompt: str, params: SamplingParams, **kw: object
) -> list[RequestOutput]:
    engine.add_prompt(rid, prompt, params, **kw)  # type: ignore[arg-type]
    outs: list[RequestOutput] = []
    while engine.has_unfinished():
        outs += [o for o in engine.step() if o.request_id == rid]
    return outs


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=3, max_tokens=12, ignore_eos=True, n=2),
    ],
    ids=["greedy", "seeded", "seeded-n2"],
)
@pytest.mark.parametrize("cut", [1, 8])
def test_a_resumed_request_continues_exactly_where_the_stream_stopped(
    engine: LLMEngine, params: SamplingParams, cut: int
) -> None:
    prompt = PROMPTS[3]
    full = run(engine, f"full-{cut}-{params.seed}-{params.n}", prompt, params)
    streamed: dict[int, list[RequestOutput]] = {}
    for out in full:
        streamed.setdefault(out.index, []).append(out)
    resume = [[t for o in streamed[i] for t in o.new_token_ids][:cut] for i in range(params.n)]
    rest = run(engine, f"rest-{cut}-{params.seed}-{params.n}", prompt, params, resume=resume)
    for i in range(params.n):
        before = [o for o in streamed[i] if o.num_output_tokens <= cut]
        after = [o for o in rest if o.index == i]
        tokens = resume[i] + [t for o in after for t in o.new_token_ids]
        assert tokens == [t for o in streamed[i] for t in o.new_token_ids]
        text = "".join(o.text_delta for o in before) + "".join(o.text_delta for o in after)
        assert text == "".join(o.text_delta for o in streamed[i])
        assert after[-1].finish_reason == "length" and after[-1].num_output_tokens == len(tokens)


def test_a_request_whose_resumed_tokens_already_ended_it_finishes_at_once(
    engine: LLMEngine,
) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    full = run(engine, "done-full", PROMPTS[0], params)
    tokens = [t for o in full for t in o.new_token_ids]
    steps_before = engine.scheduler.num_prompt_tokens_computed
    outs = run(engine, "done-again", PROMPTS[0], params, resume=[tokens])
    assert len(outs) == 1 and outs[0].finished and outs[0].finish_reason == "length"
    assert outs[0].new_token_ids == () and outs[0].num_output_tokens == 5
    assert engine.scheduler.num_prompt_tokens_computed == steps_before  # nothing ran
    assert not engine.has_unfinished()
