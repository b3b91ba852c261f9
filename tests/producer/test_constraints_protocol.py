"""The wire's structure constraints and the penalty fields (issue 20): shapes, sizes, names."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest

from producer.constraints import MAX_CONSTRAINT_BYTES, JsonSchemaConstraint
from producer.protocol import MAX_LOGIT_BIAS, JobSpec, SamplingSpec

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def _job(sampling: dict[str, Any]) -> JobSpec:
    payload = {"id": "j", "prompt": "hi", "sampling": sampling}
    return JobSpec.model_validate_json(json.dumps(payload))


@pytest.mark.parametrize(
    "structure",
    [
        {"type": "json_schema", "schema": SCHEMA},
        {"type": "json_schema", "schema": SCHEMA, "strict": False},
        {"type": "json_object"},
        {"type": "regex", "pattern": "[0-9]{3}"},
        {"type": "choice", "choices": ["yes", "no"]},
        {"type": "grammar", "grammar": 'root ::= "a" | "b"'},
    ],
)
def test_each_constraint_round_trips_in_its_wire_form(structure: dict[str, Any]) -> None:
    spec = _job({"structure": structure})
    wire = json.loads(spec.model_dump_json())["sampling"]["structure"]
    assert {k: wire[k] for k in structure} == structure
    assert _job({"structure": wire}) == spec


def test_the_schema_is_named_schema_on_the_wire_and_schema_in_python() -> None:
    constraint = JsonSchemaConstraint(schema=SCHEMA)
    assert constraint.schema_ == SCHEMA and constraint.strict
    assert json.loads(constraint.model_dump_json()) == {
        "type": "json_schema",
        "schema": SCHEMA,
        "strict": True,
    }


@pytest.mark.parametrize(
    ("structure", "message"),
    [
        ({"type": "json_schema"}, "schema"),
        ({"type": "regex", "pattern": ""}, "pattern"),
        ({"type": "choice", "choices": []}, "choices"),
        ({"type": "choice", "choices": ["a", ""]}, "choices"),
        ({"type": "grammar", "grammar": "x" * (MAX_CONSTRAINT_BYTES + 1)}, "at most 65536"),
        ({"type": "cfg", "grammar": "x"}, "tag 'cfg'"),
        ({"type": "json_object", "schema": SCHEMA}, "schema"),
    ],
)
def test_bad_constraints_are_refused_naming_the_field(
    structure: dict[str, Any], message: str
) -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        _job({"structure": structure})
    assert "sampling.structure" in str(info.value) and message in str(info.value)


def test_a_megabyte_grammar_is_refused_for_its_size() -> None:
    with pytest.raises(pydantic.ValidationError, match="serialises to 1048607 bytes"):
        SamplingSpec(structure={"type": "grammar", "grammar": "a" * 2**20})  # type: ignore[arg-type]


def test_logit_bias_keys_are_token_ids_and_values_bounded() -> None:
    assert _job({"logit_bias": {"7": -100, "0": 2.5}}).sampling.logit_bias == {7: -100.0, 0: 2.5}
    for bad in ({"-1": 1}, {"x": 1}, {"3": 100.5}, {"3": True}):
        with pytest.raises(pydantic.ValidationError, match="logit_bias"):
            _job({"logit_bias": bad})
    too_many = {str(i): 1 for i in range(MAX_LOGIT_BIAS + 1)}
    with pytest.raises(pydantic.ValidationError, match="at most 1024"):
        _job({"logit_bias": too_many})


@pytest.mark.parametrize(
    ("field", "value", "ok"),
    [
        ("presence_penalty", 2.0, True),
        ("presence_penalty", -2.5, False),
        ("frequency_penalty", -2.0, True),
        ("frequency_penalty", 2.1, False),
        ("repetition_penalty", 0.01, True),
        ("repetition_penalty", 0.0, False),
    ],
)
def test_penalty_ranges(field: str, value: float, ok: bool) -> None:
    if ok:
        assert getattr(_job({field: value}).sampling, field) == value
    else:
        with pytest.raises(pydantic.ValidationError, match=field):
            _job({field: value})


def test_a_job_without_the_new_fields_serialises_as_before_plus_defaults() -> None:
    # Additive fields with defaults: schema_version stays 1 and old payloads still validate.
    spec = _job({"max_tokens": 4})
    assert spec.schema_version == 1
    assert spec.sampling.structure is None and spec.sampling.logit_bias is None
