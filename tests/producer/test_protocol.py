"""The wire models: what a job spec may hold, and events surviving a trip through a stream."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from producer import InvalidJob, JobSpec, JobStatus, SamplingSpec
from producer.protocol import (
    MAX_METADATA_BYTES,
    CancelledEvent,
    DoneEvent,
    ErrorEvent,
    ExpiredEvent,
    StartedEvent,
    Timings,
    TokenEvent,
    TokenLogprob,
    TopLogprob,
    Usage,
    event_fields,
    is_terminal,
    parse_event,
    token_event_entry,
)
from producer.requests import build_spec


@pytest.mark.parametrize(
    "prompt",
    [
        {"prompt": "hi"},
        {"messages": [{"role": "user", "content": "hi"}]},
        {"prompt_token_ids": [1, 2, 3]},
    ],
)
def test_one_prompt_form_is_valid(prompt: dict[str, Any]) -> None:
    JobSpec.model_validate(prompt)


@pytest.mark.parametrize(
    "prompt",
    [
        {},
        {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]},
        {"prompt": "hi", "prompt_token_ids": [1]},
        {"prompt": "a", "messages": [{"role": "user", "content": "b"}], "prompt_token_ids": [1]},
        {"messages": []},
    ],
)
def test_not_exactly_one_prompt_form_is_rejected(prompt: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        JobSpec.model_validate(prompt)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("min_tokens", -1),
        ("temperature", -0.1),
        ("top_k", -2),
        ("top_p", 0.0),
        ("top_p", 1.01),
        ("min_p", -0.1),
        ("min_p", 1.1),
        ("logprobs", -1),
        ("logprobs", 21),
        ("stop", [""]),
        ("n_choices", 2),  # unknown fields are refused, not ignored
    ],
)
def test_sampling_out_of_range_is_rejected(field: str, value: Any) -> None:
    with pytest.raises(ValidationError, match=field):
        SamplingSpec.model_validate({field: value})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_k", -1),
        ("top_p", 1.0),
        ("min_p", 1.0),
        ("logprobs", 0),
        ("logprobs", 20),
        ("temperature", 0.0),
    ],
)
def test_sampling_range_ends_are_accepted(field: str, value: Any) -> None:
    assert getattr(SamplingSpec.model_validate({field: value}), field) == value


def test_min_tokens_above_max_tokens_is_rejected() -> None:
    with pytest.raises(ValidationError, match="min_tokens"):
        SamplingSpec(max_tokens=4, min_tokens=5)


@pytest.mark.parametrize(
    ("field", "value", "ok"),
    [
        ("priority", -100, True),
        ("priority", 100, True),
        ("priority", -101, False),
        ("priority", 101, False),
        ("tenant", "t" * 64, True),
        ("tenant", "t" * 65, False),
        ("tenant", "", False),
        ("surprise", 1, False),
    ],
)
def test_job_fields_ranges(field: str, value: Any, ok: bool) -> None:
    raw = {"prompt": "x", field: value}
    if ok:
        JobSpec.model_validate(raw)
    else:
        with pytest.raises(ValidationError, match=field):
            JobSpec.model_validate(raw)


def test_schema_version_defaults_to_1_and_unknown_versions_are_rejected() -> None:
    assert JobSpec(prompt="x").schema_version == 1
    assert json.loads(JobSpec(prompt="x").model_dump_json())["schema_version"] == 1
    with pytest.raises(ValidationError, match="schema_version"):
        JobSpec.model_validate({"prompt": "x", "schema_version": 2})


def test_metadata_is_limited_to_4096_bytes_of_json() -> None:
    filler = MAX_METADATA_BYTES - len(json.dumps({"k": ""}))
    JobSpec(prompt="x", metadata={"k": "a" * filler})
    with pytest.raises(ValidationError, match="metadata"):
        JobSpec(prompt="x", metadata={"k": "a" * (filler + 1)})


def test_metadata_that_is_not_json_is_an_invalid_job_not_a_type_error() -> None:
    with pytest.raises(InvalidJob, match="metadata"):
        build_spec("x", metadata={"when": object()})


@pytest.mark.parametrize("job_id", ["a", "0", "job-1.2_3:x@y", "A" * 128])
def test_valid_job_ids(job_id: str) -> None:
    assert JobSpec(prompt="x", id=job_id).id == job_id


@pytest.mark.parametrize("job_id", ["", "-a", ".a", "a b", "a/b", "a*", "é", "A" * 129, "a\n"])
def test_invalid_job_ids(job_id: str) -> None:
    with pytest.raises(ValidationError, match="id"):
        JobSpec(prompt="x", id=job_id)


def test_default_job_ids_are_unique_and_valid() -> None:
    ids = {JobSpec(prompt="x").id for _ in range(100)}
    assert len(ids) == 100


def test_build_spec_raises_invalid_job_with_a_one_line_message() -> None:
    with pytest.raises(InvalidJob) as info:
        build_spec("x", top_p=0, job_id="bad id")
    message = str(info.value)
    assert "\n" not in message
    assert "sampling.top_p" in message and "id:" in message
    assert isinstance(info.value, ValueError)


def test_build_spec_takes_flat_or_nested_sampling_and_a_relative_deadline() -> None:
    spec = build_spec("x", sampling={"max_tokens": 5, "seed": 1}, temperature=0.5, deadline_s=60)
    assert (spec.sampling.max_tokens, spec.sampling.seed, spec.sampling.temperature) == (5, 1, 0.5)
    assert spec.deadline is not None
    assert spec.model_dump()["deadline"] == spec.deadline


def test_sampling_spec_has_the_engines_fields_and_defaults() -> None:
    from worker.engine.sampling_params import SamplingParams

    engine = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
    missing = set(engine) - set(SamplingSpec.model_fields)
    extra = set(SamplingSpec.model_fields) - set(engine)
    assert not missing, f"SamplingParams fields the wire protocol lacks: {sorted(missing)}"
    assert not extra, f"SamplingSpec fields the engine lacks: {sorted(extra)}"
    ours = SamplingSpec().model_dump()
    assert {k: ours[k] for k in ours} == {k: engine[k] for k in ours}


EVENTS = [
    StartedEvent(worker="w-1", queued_s=0.25),
    TokenEvent(index=0, text="Hel", token_ids=(1, 2)),
    TokenEvent(
        index=2,
        text="lo",
        token_ids=(3,),
        logprobs=(
            TokenLogprob(
                token_id=3, logprob=-0.5, rank=1, top=(TopLogprob(token_id=3, logprob=-0.5),)
            ),
        ),
    ),
    DoneEvent(
        finish_reason="length",
        usage=Usage(prompt_tokens=4, completion_tokens=3, total_tokens=7),
        timings=Timings(queued_s=0.25, ttft_s=None, total_s=1.5),
    ),
    ErrorEvent(code="prompt_too_long", message="too long"),
    CancelledEvent(),
    CancelledEvent(usage=Usage(prompt_tokens=1, completion_tokens=0, total_tokens=1)),
    ExpiredEvent(message="deadline passed"),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.type)
def test_events_survive_a_stream_entry(event: Any) -> None:
    fields = event_fields(event)
    assert fields["type"] == event.type
    assert "event_id" not in json.loads(fields["data"])
    back = parse_event("7-0", fields)
    assert back.event_id == "7-0"
    assert back.model_copy(update={"event_id": None}) == event
    assert is_terminal(back) == (event.type in {"done", "error", "cancelled", "expired"})


def test_status_from_hash_types_the_fields() -> None:
    status = JobStatus.from_hash(
        "j",
        {
            "state": "running",
            "submitted_at": "1700000000.000001",
            "priority": "-3",
            "tenant": "t",
            "stream_id": "1-0",
            "cancel_requested": "1",
            "completion_tokens": "5",
            "error_code": "",
        },
    )
    assert status.state == "running" and status.priority == -3 and status.cancel_requested
    assert status.submitted_at == pytest.approx(1700000000.000001)
    assert status.completion_tokens == 5 and status.error_code is None


def test_importing_the_producer_does_not_import_torch_or_the_worker() -> None:
    code = (
        "import sys, producer, producer.cli, producer.aio\n"
        "assert 'torch' not in sys.modules, 'torch'\n"
        "assert not any(m == 'worker' or m.startswith('worker.') for m in sys.modules), 'worker'\n"
        "import worker.cli\n"
        "assert 'torch' not in sys.modules, 'torch via worker.cli'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_the_protocol_doc_quotes_the_scripts_exactly() -> None:
    from producer import scripts

    doc = (Path(__file__).parents[2] / "docs" / "protocol.md").read_text()
    blocks = re.findall(r"```lua\n(.*?)\n```", doc, flags=re.DOTALL)
    expected = [scripts.SUBMIT, scripts.CANCEL, scripts.CLAIM, scripts.RECLAIM]
    assert blocks == [s.strip() for s in expected]


@given(
    choice=st.integers(0, 127),
    index=st.integers(0, 2**40),
    # Any text a detokenizer can give: control characters, quotes, non-BMP, U+FFFD, U+2028.
    text=st.text(st.characters(exclude_categories=("Cs",))),
    token_ids=st.lists(st.integers(0, 2**31 - 1), max_size=8),
)
def test_token_event_entry_is_the_models_entry(
    choice: int, index: int, text: str, token_ids: list[int]
) -> None:
    """The worker's per-token shortcut writes what the model would, character for character,
    and reads back as that event."""
    event = TokenEvent(choice=choice, index=index, text=text, token_ids=tuple(token_ids))
    entry = token_event_entry(choice, index, text, token_ids)
    fields = dict(zip(entry[::2], entry[1::2], strict=True))
    assert fields == event_fields(event) and list(fields) == list(event_fields(event))
    read = parse_event("1-0", fields)
    assert read == event.model_copy(update={"event_id": "1-0"})
