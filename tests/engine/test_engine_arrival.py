"""Aging counts from the request's arrival, not from when the scheduler first sees it.

A request's ``arrival_time`` (its submission on the engine's clock) is what ages it: time held
while its constraint compiles, or in the worker's inbox, counts. The engine's aging clock is
replaced by a fake one, so each age is exact and no test sleeps.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pytest

from producer.constraints import RegexConstraint
from tests.engine.sched_clock import FakeClock
from tests.engine.test_constraints import make_engine
from worker.engine.engine_request import EngineRequest
from worker.engine.grammar import CompiledGrammar
from worker.engine.llm_engine import LLMEngine
from worker.engine.sampling_params import SamplingParams
from worker.engine.sequence import Sequence
from worker.engine.wait_reasons import WaitReason

PROMPT = (1, 2, 3, 4, 5)


@pytest.fixture
def engine(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> LLMEngine:
    engine = make_engine(tiny_model_dir)
    monkeypatch.setattr(engine.scheduler.aging, "clock", FakeClock())
    return engine


def running(engine: LLMEngine, request_id: str) -> Sequence:
    return next(s for s in engine.scheduler.running if s.request_id == request_id)


def advance(engine: LLMEngine, seconds: float) -> None:
    clock = engine.scheduler.aging.clock
    assert isinstance(clock, FakeClock)
    clock.now_s += seconds


def test_a_request_ages_from_its_arrival_time(engine: LLMEngine) -> None:
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    engine.add_request(EngineRequest("old", PROMPT, params, arrival_time=-30.0))
    engine.add_request(EngineRequest("new", PROMPT, params))  # None: arrives now (0.0)
    advance(engine, 2.0)
    engine.step()
    assert engine.scheduler.aging.age_s(running(engine, "old")) == 32.0
    assert engine.scheduler.aging.age_s(running(engine, "new")) == 2.0


def test_the_time_a_constraint_compiles_counts_toward_the_wait(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    structure = RegexConstraint(pattern="[0-9]{4}")
    compiles = engine._constraints.compiles
    real_submit = compiles.submit
    pending: Future[CompiledGrammar] = Future()  # the compile, done when the test says so

    def submit(s: object) -> Future[CompiledGrammar]:
        return pending if not pending.done() else real_submit(structure)

    monkeypatch.setattr(compiles, "submit", submit)
    params = SamplingParams(max_tokens=8, structure=structure)
    engine.add_request(EngineRequest("held", PROMPT, params))
    assert engine.wait_info()["held"].reason is WaitReason.COMPILING_GRAMMAR
    advance(engine, 7.0)  # seven seconds of compiling
    pending.set_result(real_submit(structure).result())
    engine.step()  # released, admitted and run in this step
    assert engine.scheduler.aging.age_s(running(engine, "held")) == 7.0
