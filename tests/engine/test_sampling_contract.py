"""One contract from the wire to the engine: the sampling fields, the request, the finish reason.

``SamplingSpec`` declares the sampling names, defaults and ranges once; the engine's
``SamplingParams`` derives from it. ``EngineRequest`` is the one object into the engine and
``validate_request`` its one admission check. ``FinishReason`` is one type end to end.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pydantic
import pytest

from producer import status
from producer.protocol import ChoiceEnd, DoneEvent, SamplingSpec, Timings, Usage
from worker.engine import sequence
from worker.engine.engine_request import EngineRequest, validate_request
from worker.engine.prompt import InvalidRequestError, PromptTooLongError
from worker.engine.sampling_params import InvalidSamplingParams, SamplingParams, allowed_range


def test_the_engine_params_have_the_spec_fields_and_defaults() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
    spec = {name: info.default for name, info in SamplingSpec.model_fields.items()}
    assert fields == spec


def test_from_spec_carries_every_field() -> None:
    spec = SamplingSpec(max_tokens=7, temperature=0.5, stop=("x",), n=3, seed=9, logprobs=2)
    params = SamplingParams.from_spec(spec)
    assert dataclasses.asdict(params) == spec.model_dump()


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"n": 17}, "n: 1..16"),
        ({"top_p": 0.0}, "top_p: (0.0, 1.0]"),
        ({"min_p": 1.5}, "min_p: [0.0, 1.0]"),
        ({"max_tokens": 0}, "max_tokens: >= 1"),
        ({"top_k": -2}, "top_k: >= -1"),
        ({"logprobs": 21}, "logprobs: 0..20"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens: must be <= max_tokens"),
        ({"stop": ("",)}, "stop: "),
    ],
)
def test_ranges_come_from_the_spec_declaration(bad: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidSamplingParams) as info:
        SamplingParams(**bad)  # type: ignore[arg-type]
    assert str(info.value).startswith(f"invalid sampling parameter {message}")


def test_the_engine_params_are_checked_by_the_spec_itself() -> None:
    # The spec's own validation, strictness included: a bool is no token count.
    with pytest.raises(InvalidSamplingParams, match="max_tokens"):
        SamplingParams(max_tokens=True)
    assert allowed_range("seed") == ""  # no bounds declared: the check names none
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)  # type: ignore[arg-type]


def test_an_engine_request_freezes_what_it_is_given() -> None:
    request = EngineRequest("r", [1, 2, 3], resume=[[4, 5]])  # type: ignore[arg-type]
    assert request.prompt_token_ids == (1, 2, 3) and request.resume == ((4, 5),)
    assert request.params == SamplingParams() and request.priority == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.tenant = "other"  # type: ignore[misc]


def test_choice_params_give_each_seeded_choice_its_own_seed() -> None:
    request = EngineRequest("r", (1,), SamplingParams(seed=5, n=3))
    seeds = [request.choice_params(i).seed for i in range(3)]
    assert seeds[0] == 5 and len(set(seeds)) == 3
    unseeded = EngineRequest("r", (1,), SamplingParams(n=2))
    assert unseeded.choice_params(1) is unseeded.params


def test_validate_request_is_every_admission_check() -> None:
    ok = SamplingParams(max_tokens=6)
    validate_request([1, 2], ok, max_model_len=8, vocab_size=10, refuse_past_context=True)
    with pytest.raises(InvalidSamplingParams, match="stop_token_ids"):
        validate_request([1], SamplingParams(stop_token_ids=(10,)), 8, 10)
    with pytest.raises(InvalidRequestError, match="empty"):
        validate_request([], ok, 8, 10)
    with pytest.raises(InvalidRequestError, match="out of range"):
        validate_request([10], ok, 8, 10)
    with pytest.raises(PromptTooLongError):
        validate_request(list(range(8)), ok, 8, 10)
    # Past the context: the engine stops at it (``length``); the job service refuses it.
    validate_request([1, 2, 3], ok, 8, 10)
    with pytest.raises(InvalidSamplingParams, match="at most 5 fit"):
        validate_request([1, 2, 3], ok, 8, 10, refuse_past_context=True)


def test_the_finish_reason_is_one_type_from_engine_to_wire() -> None:
    assert sequence.FinishReason is status.FinishReason
    assert [r.value for r in status.FinishReason if r.ends_done] == [
        "stop",
        "length",
        "stop_string",
        "deadline",
    ]
    usage = Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
    timings = Timings(queued_s=0.0, total_s=0.1)
    done = DoneEvent(finish_reason=status.FinishReason.STOP, usage=usage, timings=timings)
    assert done.model_dump(mode="json")["finish_reason"] == "stop"
    for engine_only in ("abort", "error"):
        with pytest.raises(pydantic.ValidationError, match="does not carry"):
            DoneEvent(finish_reason=engine_only, usage=usage, timings=timings)  # type: ignore[arg-type]
        with pytest.raises(pydantic.ValidationError, match="does not carry"):
            ChoiceEnd(choice=0, finish_reason=engine_only, completion_tokens=1)  # type: ignore[arg-type]


def test_the_engine_reads_the_protocol_without_the_redis_clients() -> None:
    # ``import producer.protocol`` runs ``producer/__init__``: its names load on first use.
    code = "import sys, worker.engine.engine_request; print('redis' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
