"""Structure constraints through Redis (issue 20): a bad one ends its job with invalid_request on
its stream before it starts, a good one's output matches, and the worker serves on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from producer import JobFailed, Producer
from producer.protocol import ErrorEvent, StartedEvent
from tests.service.conftest import running_worker, tiny_engine
from tests.service.streams import follow_raw_job
from tests.service.test_worker import assert_serves_on
from worker.engine.llm_engine import LLMEngine

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "enum": [1, 2, 3]}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> LLMEngine:
    return tiny_engine(tiny_model_dir)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"json_schema": {"type": "strnig"}}, 'json_schema: Unsupported type "strnig"'),
        ({"regex": "[a-"}, "regex: Regex parsing error at position 4: Unclosed"),
        ({"grammar": 'root ::= "a" | b'}, "grammar: EBNF parser error at line 1, column 16"),
    ],
)
def test_a_constraint_that_does_not_parse_fails_its_job_before_it_starts(
    engine: LLMEngine, redis_url: str, prefix: str, kwargs: dict[str, object], message: str
) -> None:
    with running_worker(engine, redis_url, prefix), Producer(redis_url, prefix=prefix) as p:
        handle = p.submit("hi", max_tokens=8, **kwargs)
        with pytest.raises(JobFailed) as info:
            handle.result(timeout_s=30)
        assert info.value.code == "invalid_request"
        assert f"invalid sampling parameter structure: {message}" in str(info.value)
        events = list(p.stream(handle.job_id, timeout_s=5))
        assert not any(isinstance(e, StartedEvent) for e in events)  # refused at the door
        assert_serves_on(p)


def test_a_constraint_over_the_size_cap_is_refused_naming_the_field(
    engine: LLMEngine, redis_url: str, prefix: str
) -> None:
    # A raw client's 100 KB grammar: the worker's own check of the payload refuses it.
    grammar = "root ::= " + " | ".join(f'"w{i}"' for i in range(12_000))
    sampling = {"structure": {"type": "grammar", "grammar": grammar}}
    payload = json.dumps({"id": "big-grammar", "prompt": "hi", "sampling": sampling})
    with running_worker(engine, redis_url, prefix), Producer(redis_url, prefix=prefix) as p:
        p.redis.xadd(p.keys.jobs, {"id": "big-grammar", "payload": payload})
        (error,) = follow_raw_job(p, "big-grammar")
        assert isinstance(error, ErrorEvent) and error.code == "invalid_request"
        assert "sampling.structure.grammar" in error.message and "at most 65536" in error.message
        assert_serves_on(p)


def test_constrained_jobs_through_redis_match_their_constraint(
    engine: LLMEngine, redis_url: str, prefix: str
) -> None:
    with running_worker(engine, redis_url, prefix), Producer(redis_url, prefix=prefix) as p:
        schema_job = p.submit("JSON:", max_tokens=60, temperature=1.0, seed=4, json_schema=SCHEMA)
        choice_job = p.submit("Pick:", max_tokens=8, choice=["left", "right"], n=2, seed=1)
        regex_job = p.submit("Id:", max_tokens=12, regex="[a-z]{3}[0-9]{2}", temperature=1.0)
        result = schema_job.result(timeout_s=60)
        assert result.finish_reason == "stop"
        jsonschema.validate(json.loads(result.text), SCHEMA)
        choices = choice_job.result(timeout_s=60).choices
        assert choices and all(c.text in ("left", "right") for c in choices)
        assert re.fullmatch("[a-z]{3}[0-9]{2}", regex_job.result(timeout_s=60).text)


def test_a_schema_that_parses_but_does_not_compile_is_invalid_request_each_time(
    engine: LLMEngine, redis_url: str, prefix: str
) -> None:
    # Valid JSON Schema whose pattern (a lookbehind) no grammar backend compiles: the intake's
    # parse passes, the compile thread fails. The first job ends from the engine's gate, the
    # second at add_request (the failure is cached): both are the caller's invalid_request.
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)a"}}}
    with running_worker(engine, redis_url, prefix), Producer(redis_url, prefix=prefix) as p:
        for _ in range(2):
            handle = p.submit("hi", max_tokens=8, json_schema=schema)
            with pytest.raises(JobFailed) as info:
                handle.result(timeout_s=30)
            assert info.value.code == "invalid_request", str(info.value)
            assert "invalid sampling parameter structure: json_schema:" in str(info.value)
            assert "the job failed" not in str(info.value)  # the worker's own failures say so
        assert_serves_on(p)
