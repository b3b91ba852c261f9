"""Structure constraints: what a job's output must match, as ``SamplingSpec.structure`` carries it.

One constraint per job, a union told apart by ``type``: a JSON Schema, any JSON object, a regular
expression, one string of a list, or a grammar in the EBNF the worker's grammar backend takes
(xgrammar's: a ``root`` rule, ``::=``, quoted literals, character classes). The wire checks the
shape and the size; whether a schema, regex or grammar compiles is the worker's check, and one
that does not ends the job with ``error`` / ``invalid_request`` naming the problem.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from producer.wire import Frozen, WireBool

# A constraint at most, serialised: it rides in the job's payload (1 MiB in all) and is compiled
# on the worker's compile thread, whose time grows with its size while other jobs' constraints
# queue behind it. The largest real schemas (an API's full request body) are a few KiB; 64 KiB
# leaves room for those many times over and keeps one job from holding the compiler for long.
MAX_CONSTRAINT_BYTES = 64 * 1024

NonEmpty = Annotated[str, Field(min_length=1)]


class _Constraint(Frozen):
    @model_validator(mode="after")
    def _small(self) -> _Constraint:
        size = len(self.model_dump_json(by_alias=True).encode())
        if size > MAX_CONSTRAINT_BYTES:
            kind = getattr(self, "type")  # noqa: B009  (each subclass declares its Literal)
            raise ValueError(
                f"structure {kind} serialises to {size} bytes; at most {MAX_CONSTRAINT_BYTES}"
            )
        return self


class JsonSchemaConstraint(_Constraint):
    """Output is JSON that validates against ``schema`` (on the wire: ``schema``). ``strict``:
    properties and items the schema does not name are not generated (OpenAI's strict mode);
    false lets the grammar allow what JSON Schema's defaults allow (additional properties)."""

    # `schema` would shadow pydantic's BaseModel.schema: the attribute is `schema_`, the wire
    # name `schema` in both directions.
    model_config = ConfigDict(
        frozen=True, extra="forbid", serialize_by_alias=True, validate_by_name=True
    )
    type: Literal["json_schema"] = "json_schema"
    schema_: dict[str, Any] = Field(alias="schema")
    strict: WireBool = True

    @model_validator(mode="before")
    @classmethod
    def _serialisable(cls, data: Any) -> Any:
        schema = data.get("schema", data.get("schema_")) if isinstance(data, dict) else None
        try:
            json.dumps(schema, allow_nan=False)
        except (TypeError, ValueError) as exc:  # pydantic reports ValueError, not TypeError
            raise ValueError(f"structure json_schema: schema must be plain JSON: {exc}") from exc
        return data


class JsonObjectConstraint(_Constraint):
    """Output is one JSON object, any keys and values (OpenAI's JSON mode)."""

    type: Literal["json_object"] = "json_object"


class RegexConstraint(_Constraint):
    """Output matches ``pattern`` in full (the grammar backend's regex dialect: no lookaround
    or backreferences)."""

    type: Literal["regex"] = "regex"
    pattern: NonEmpty


class ChoiceConstraint(_Constraint):
    """Output is exactly one of ``choices``."""

    type: Literal["choice"] = "choice"
    choices: tuple[NonEmpty, ...] = Field(min_length=1)


class GrammarConstraint(_Constraint):
    """Output is a sentence of ``grammar``, EBNF with a ``root`` rule."""

    type: Literal["grammar"] = "grammar"
    grammar: NonEmpty


Structure = Annotated[
    JsonSchemaConstraint
    | JsonObjectConstraint
    | RegexConstraint
    | ChoiceConstraint
    | GrammarConstraint,
    Field(discriminator="type"),
]
