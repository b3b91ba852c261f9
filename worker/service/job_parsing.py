"""Turning a jobs-stream entry into a validated spec and prompt token ids, or a rejection.

Pure functions of the entry and the model's limits: the intake thread calls them before it
claims a job, so bad input gets its ``error`` event without ever being marked started.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from producer.protocol import SUPPORTED_SCHEMA_VERSIONS, ErrorCode, JobSpec
from worker.engine.prompt import (
    InvalidRequestError,
    PromptTooLongError,
    check_prompt,
    encode_prompt,
)


class Rejected(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class PromptLimits:
    """What intake needs of the engine to validate prompts, without touching the engine."""

    def __init__(self, tokenizer: Any, max_model_len: int, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size


def parse_job(job_id: str, payload: str | None, limits: PromptLimits) -> tuple[JobSpec, list[int]]:
    """The validated spec and prompt token ids, or Rejected with the error code to publish."""
    try:
        raw = json.loads(payload or "")
    except json.JSONDecodeError as exc:
        raise Rejected(ErrorCode.MALFORMED_JSON, f"payload is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise Rejected(ErrorCode.MALFORMED_JSON, "payload must be a JSON object")
    version = raw.get("schema_version", 1)
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        raise Rejected(
            ErrorCode.UNSUPPORTED_SCHEMA_VERSION,
            f"schema_version {version!r} is not supported by this worker "
            f"(supported: {sorted(SUPPORTED_SCHEMA_VERSIONS)})",
        )
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as exc:
        raise Rejected(ErrorCode.INVALID_REQUEST, _short(exc)) from exc
    if spec.id != job_id:
        raise Rejected(ErrorCode.INVALID_REQUEST, f"payload id {spec.id!r} != entry id {job_id!r}")
    return spec, _prompt_ids(spec, limits)


def _prompt_ids(spec: JobSpec, limits: PromptLimits) -> list[int]:
    try:
        if spec.prompt_token_ids is not None:
            ids = list(spec.prompt_token_ids)
        elif spec.messages is not None:
            ids = encode_prompt(limits.tokenizer, [m.model_dump() for m in spec.messages])
        else:
            ids = encode_prompt(limits.tokenizer, spec.prompt or "")
        check_prompt(ids, limits.max_model_len, limits.vocab_size)
    except PromptTooLongError as exc:
        raise Rejected(ErrorCode.PROMPT_TOO_LONG, str(exc)) from exc
    except InvalidRequestError as exc:
        raise Rejected(ErrorCode.INVALID_PROMPT, str(exc)) from exc
    return ids


def _short(exc: ValidationError) -> str:
    parts = [f"{'.'.join(map(str, e['loc'])) or 'job'}: {e['msg']}" for e in exc.errors()[:5]]
    return "invalid job: " + "; ".join(parts)
