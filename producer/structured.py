"""The structure keywords of ``Producer.submit`` and ``paternoster submit``, as one constraint.

``json_schema=``, ``regex=``, ``choice=``, ``grammar=`` each name one kind of
``producer.constraints`` constraint; this turns whichever was given into the dict
``SamplingSpec.structure`` validates, so the clients, the CLI and the gateway build the same
thing. A Pydantic model class is taken as its JSON Schema (``model_json_schema()``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from producer.errors import InvalidJob

STRUCTURE_KEYWORDS = ("json_schema", "regex", "choice", "grammar")


def schema_of(json_schema: Any) -> dict[str, Any]:
    """A JSON Schema as a dict: a mapping as given, a Pydantic model class by its schema."""
    if isinstance(json_schema, type) and hasattr(json_schema, "model_json_schema"):
        schema: dict[str, Any] = json_schema.model_json_schema()
        return schema
    if isinstance(json_schema, Mapping):
        return dict(json_schema)
    raise InvalidJob(
        "invalid job: json_schema: give a JSON Schema (a dict) or a Pydantic model class, "
        f"not {type(json_schema).__name__}"
    )


def structure_of(
    *,
    json_schema: Any = None,
    regex: str | None = None,
    choice: Sequence[str] | None = None,
    grammar: str | None = None,
) -> dict[str, Any] | None:
    """The ``structure`` constraint of whichever keyword was given (None: none was); more than
    one is an InvalidJob, since a job's output follows one constraint."""
    given = {
        name: value
        for name, value in zip(
            STRUCTURE_KEYWORDS, (json_schema, regex, choice, grammar), strict=True
        )
        if value is not None
    }
    if len(given) > 1:
        raise InvalidJob(f"invalid job: give one of {', '.join(given)}, not {len(given)}")
    if json_schema is not None:
        return {"type": "json_schema", "schema": schema_of(json_schema)}
    if regex is not None:
        return {"type": "regex", "pattern": regex}
    if choice is not None:
        if isinstance(choice, str):  # a string is a sequence of its letters: not meant
            raise InvalidJob("invalid job: choice: give a list of strings, not one string")
        return {"type": "choice", "choices": list(choice)}
    if grammar is not None:
        return {"type": "grammar", "grammar": grammar}
    return None


def read_schema_file(path: str) -> dict[str, Any]:
    """``--json-schema FILE``: the file's JSON (InvalidJob, exit 2, when it is not an object)."""
    try:
        schema = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidJob(f"invalid job: --json-schema {path}: {exc}") from None
    if not isinstance(schema, dict):
        raise InvalidJob(f"invalid job: --json-schema {path}: a JSON Schema is a JSON object")
    return schema


def read_grammar_file(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, ValueError) as exc:
        raise InvalidJob(f"invalid job: --grammar {path}: {exc}") from None
