"""The structure, penalty and tool arguments of ``build_spec``, both clients and ``paternoster
submit``: each way in builds the same ``SamplingSpec.structure`` and fields."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Literal

import pytest
import redis
from pydantic import BaseModel

from producer import AsyncProducer, InvalidJob, Keys, Producer
from producer.constraints import (
    ChoiceConstraint,
    GrammarConstraint,
    JsonSchemaConstraint,
    RegexConstraint,
)
from producer.requests import build_spec
from tests.producer.test_sampling_args import payload as sent_payload
from worker.cli import main


def payload(client: redis.Redis, keys: Keys, job_id: str) -> Any:
    return sent_payload(client, keys, job_id)


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
TOOL = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object"}}}


class Verdict(BaseModel):
    ok: bool
    label: Literal["a", "b"]


def test_each_structure_keyword() -> None:
    schema = build_spec("hi", json_schema=SCHEMA).sampling.structure
    assert isinstance(schema, JsonSchemaConstraint) and schema.schema_ == SCHEMA
    model = build_spec("hi", json_schema=Verdict).sampling.structure
    assert isinstance(model, JsonSchemaConstraint)
    assert model.schema_ == Verdict.model_json_schema()
    regex = build_spec("hi", regex=r"\d{3}").sampling.structure
    assert isinstance(regex, RegexConstraint) and regex.pattern == r"\d{3}"
    choice = build_spec("hi", choice=["yes", "no"]).sampling.structure
    assert isinstance(choice, ChoiceConstraint) and choice.choices == ("yes", "no")
    grammar = build_spec("hi", grammar='root ::= "a"').sampling.structure
    assert isinstance(grammar, GrammarConstraint)
    flat = build_spec("hi", structure={"type": "json_object"}).sampling.structure
    assert flat is not None and flat.type == "json_object"


def test_structure_refusals() -> None:
    with pytest.raises(InvalidJob, match="give one of json_schema, regex, not 2"):
        build_spec("hi", json_schema=SCHEMA, regex="a")
    with pytest.raises(InvalidJob, match="not both"):
        build_spec("hi", regex="a", structure={"type": "json_object"})
    with pytest.raises(InvalidJob, match="not one string"):
        build_spec("hi", choice="yes")
    with pytest.raises(InvalidJob, match="Pydantic model class, not int"):
        build_spec("hi", json_schema=3)
    with pytest.raises(InvalidJob, match=r"sampling\.structure\.choice\.choices"):
        build_spec("hi", choice=[])


def test_penalties_and_tools() -> None:
    spec = build_spec(
        messages=[{"role": "user", "content": "hi"}],
        presence_penalty=0.5,
        repetition_penalty=1.1,
        logit_bias={3: -100},
        tools=[TOOL],
    )
    assert spec.sampling.presence_penalty == 0.5 and spec.sampling.logit_bias == {3: -100.0}
    assert spec.tools is not None and spec.tools[0].function.name == "ping"
    with pytest.raises(InvalidJob, match="tools: give messages"):
        build_spec("hi", tools=[TOOL])


def test_both_clients_carry_them(
    producer: Producer, redis_url: str, key_prefix: str, client: redis.Redis, keys: Keys
) -> None:
    producer.submit("hi", job_id="sync-s", json_schema=Verdict, frequency_penalty=0.3)
    sent = payload(client, keys, "sync-s")["sampling"]
    assert sent["structure"]["schema"] == Verdict.model_json_schema()
    assert sent["frequency_penalty"] == 0.3

    async def submit() -> None:
        async with AsyncProducer(redis_url, prefix=key_prefix) as aio:
            await aio.submit("hi", job_id="async-s", choice=["x", "y"], logit_bias={"7": 2.0})

    asyncio.run(submit())
    sent = payload(client, keys, "async-s")["sampling"]
    assert sent["structure"] == {"type": "choice", "choices": ["x", "y"]}
    assert sent["logit_bias"] == {"7": 2.0}


def test_submit_flags(
    redis_url: str, key_prefix: str, client: redis.Redis, keys: Keys, tmp_path: Path
) -> None:
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    base = ["submit", "--redis-url", redis_url, "--prefix", key_prefix]
    extra = ["--presence-penalty", "0.25", "--logit-bias", "5=-100", "--logit-bias", "9=1.5"]
    assert main([*base, "--id", "f1", "--json-schema", str(schema_file), *extra, "hi"]) == 0
    sent = payload(client, keys, "f1")["sampling"]
    assert sent["structure"] == {"type": "json_schema", "schema": SCHEMA, "strict": True}
    assert sent["presence_penalty"] == 0.25
    assert sent["logit_bias"] == {"5": -100.0, "9": 1.5}
    assert main([*base, "--id", "f2", "--choice", "A", "--choice", "B", "hi"]) == 0
    assert payload(client, keys, "f2")["sampling"]["structure"]["choices"] == ["A", "B"]
    grammar = tmp_path / "g.ebnf"
    grammar.write_text('root ::= "yes" | "no"')
    with pytest.raises(SystemExit):  # argparse: one structure flag at most
        main([*base, "--id", "f3", "--grammar", str(grammar), "--regex", "a"])
    assert main([*base, "--id", "f3", "--grammar", str(grammar), "hi"]) == 0
    assert payload(client, keys, "f3")["sampling"]["structure"]["type"] == "grammar"


def test_submit_flag_errors(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["submit", "--redis-url", redis_url]
    assert main([*base, "--json-schema", str(tmp_path / "missing.json"), "hi"]) == 2
    assert "--json-schema" in capsys.readouterr().err
    (tmp_path / "list.json").write_text("[1]")
    assert main([*base, "--json-schema", str(tmp_path / "list.json"), "hi"]) == 2
    assert "a JSON Schema is a JSON object" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--logit-bias", "five", "hi"])
    assert "expected ID=BIAS" in capsys.readouterr().err
