"""One request's failure inside a step fails that request; the others in the step go on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.engine.test_engine import PROMPTS, make_engine
from worker.engine.llm_engine import InvalidRequestError, LLMEngine
from worker.engine.outputs import RequestOutput
from worker.engine.sampling_params import InvalidSamplingParams, SamplingParams
from worker.engine.scheduler_output import SchedulerOutput

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def run_all(engine: LLMEngine) -> dict[str, list[RequestOutput]]:
    outs: dict[str, list[RequestOutput]] = {}
    for _ in range(200):
        if not engine.has_unfinished():
            return outs
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)
    raise AssertionError("the engine did not finish")


def tokens(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def free_when_idle(engine: LLMEngine) -> None:
    assert not engine.has_unfinished()
    assert engine.block_manager.num_free_blocks == engine.runner.num_blocks
    engine.block_manager.assert_invariants([])


@pytest.fixture
def engine(tiny_model_dir: Path) -> LLMEngine:
    return make_engine(tiny_model_dir)


@pytest.mark.parametrize("bad", [[-1], [99_999_999], [3, 10**6]])
def test_a_stop_token_outside_the_vocabulary_is_refused_at_admission(
    engine: LLMEngine, bad: list[int]
) -> None:
    params = SamplingParams(stop_token_ids=tuple(bad))
    with pytest.raises(InvalidSamplingParams, match="stop_token_ids") as info:
        engine.add_prompt("bad", "hi", params)
    assert isinstance(info.value, InvalidRequestError)  # callers that catch one catch both
    assert not engine.has_unfinished()


def expected_tokens(engine: LLMEngine) -> list[list[int]]:
    return [list(c.token_ids) for c in engine.generate(PROMPTS[:3], GREEDY)]


def test_a_runner_failure_of_one_request_fails_only_that_request(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = expected_tokens(engine)
    real = engine.runner.run

    def poisoned(decision: SchedulerOutput) -> Any:
        if any(s.request_id == "poison" for s in decision.scheduled):
            raise RuntimeError("device fault on the poison row")
        return real(decision)

    monkeypatch.setattr(engine.runner, "run", poisoned)
    for i, prompt in enumerate(PROMPTS[:3]):
        engine.add_prompt(f"ok-{i}", prompt, GREEDY)
    engine.add_prompt("poison", PROMPTS[3], SamplingParams(n=2, max_tokens=6))
    outs = run_all(engine)
    assert [tokens(outs[f"ok-{i}"]) for i in range(3)] == expected  # unchanged by the fault
    poison = outs["poison"]
    assert {o.index for o in poison} == {0, 1}  # both choices end, each once
    assert all(o.finish_reason == "error" and o.finished for o in poison)
    assert all("device fault on the poison row" in (o.error or "") for o in poison)
    free_when_idle(engine)


def test_a_sampling_failure_of_one_row_fails_only_its_request(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = expected_tokens(engine)
    real = engine.sampler.__class__.sample_ids  # __call__ samples with it, the overlapped loop too
    marker = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, seed=4242)

    def poisoned(self: Any, logits: Any, requests: Any) -> Any:
        if any(r.params.seed == 4242 for r in requests):
            raise ValueError("bad row")
        return real(self, logits, requests)

    monkeypatch.setattr(engine.sampler.__class__, "sample_ids", poisoned)
    for i, prompt in enumerate(PROMPTS[:3]):
        engine.add_prompt(f"ok-{i}", prompt, GREEDY)
    engine.add_prompt("poison", PROMPTS[4], marker)
    outs = run_all(engine)
    assert [tokens(outs[f"ok-{i}"]) for i in range(3)] == expected
    assert [o.finish_reason for o in outs["poison"]] == ["error"]
    assert "ValueError: bad row" in (outs["poison"][0].error or "")
    free_when_idle(engine)


def test_a_detokenizer_failure_fails_only_its_request(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = expected_tokens(engine)
    engine.add_prompt("poison", PROMPTS[4], GREEDY)
    for i, prompt in enumerate(PROMPTS[:3]):
        engine.add_prompt(f"ok-{i}", prompt, GREEDY)
    (state,) = engine._requests["poison"]

    def explode(token_ids: object) -> str:
        raise UnicodeError("cannot decode")

    monkeypatch.setattr(state.detokenizer, "add_token", explode)  # the engine's per-row call
    monkeypatch.setattr(state.detokenizer, "add_tokens", explode)
    outs = run_all(engine)
    assert [tokens(outs[f"ok-{i}"]) for i in range(3)] == expected
    assert [o.finish_reason for o in outs["poison"]] == ["error"]
    free_when_idle(engine)


def test_scheduler_update_works_from_the_output_it_is_given(engine: LLMEngine) -> None:
    """No hidden replay of the last plan: the output says what was computed; applying one twice
    is refused, and a sequence that ended in between is skipped."""
    engine.add_prompt("a", PROMPTS[0], GREEDY)
    engine.add_prompt("b", PROMPTS[2], GREEDY)
    scheduler = engine.scheduler
    out = scheduler.schedule()
    (seq_b,) = [s for s in scheduler.running if s.request_id == "b"]
    engine.abort("b")  # ends between the plan and its update
    scheduler.update(out)
    (seq_a,) = scheduler.running
    assert seq_a.num_computed_tokens == seq_a.num_prompt_tokens
    assert seq_b.num_computed_tokens == 0
    with pytest.raises(ValueError, match="stale"):
        scheduler.update(out)
