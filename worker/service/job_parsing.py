"""Turning a jobs-stream entry into a validated spec and prompt token ids, or a rejection.

Pure functions of the entry and the model's limits: the intake thread calls them before it
claims a job, so bad input gets its ``error`` event without ever being marked started.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from producer.protocol import MAX_PAYLOAD_BYTES, SUPPORTED_SCHEMA_VERSIONS, ErrorCode, JobSpec
from worker.engine.engine_request import validate_request
from worker.engine.prompt import InvalidRequestError, PromptTooLongError, encode_prompt
from worker.engine.sampling_params import SamplingParams
from worker.service.error_codes import error_code


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
        # No token stands for more UTF-8 bytes than its vocabulary entry spells (byte-level BPE
        # and sentencepiece write each byte as one character of 1-3 bytes, byte fallbacks as
        # six); times 4 for normalisers that compose characters. A prompt over this many bytes
        # has at least max_model_len tokens: it is refused before the tokenizer spends seconds
        # on it (21.6 MB took the intake thread 36 s once).
        self.max_prompt_bytes = 4 * _longest_token_bytes(tokenizer) * max_model_len


def parse_job(
    job_id: str, payload: str | None, limits: PromptLimits
) -> tuple[JobSpec, list[int], SamplingParams]:
    """The validated spec, prompt token ids and sampling params, or Rejected with the error
    code to publish. Every check a job can fail happens here, before it is claimed: nothing
    that passes can make a step raise."""
    raw = _payload_object(payload)
    if "id" not in raw:
        raise Rejected(
            ErrorCode.INVALID_REQUEST, f"payload has no id: give the entry's, {job_id!r}"
        )
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
    params = SamplingParams.from_spec(spec.sampling)
    try:
        ids = _prompt_ids(spec, limits)
        # The engine's own check, once, here: max_tokens past the context is refused (not cut).
        validate_request(
            ids, params, limits.max_model_len, limits.vocab_size, refuse_past_context=True
        )
    except InvalidRequestError as exc:  # each kind's code from the one mapping (error_codes)
        raise Rejected(error_code(type(exc)), str(exc)) from exc
    return spec, ids, params


def _payload_object(payload: str | None) -> dict[str, Any]:
    if payload is None:
        raise Rejected(ErrorCode.MALFORMED_JSON, "the entry has no payload field")
    if len(payload) > MAX_PAYLOAD_BYTES:  # characters <= bytes: a cheap first bound
        raise Rejected(
            ErrorCode.INVALID_REQUEST, f"payload is over the limit of {MAX_PAYLOAD_BYTES} bytes"
        )
    try:
        size = len(payload.encode("utf-8"))
    except UnicodeEncodeError as exc:  # the reader decodes with surrogateescape: bad bytes
        raise Rejected(ErrorCode.MALFORMED_JSON, f"payload is not valid UTF-8: {exc}") from exc
    if size > MAX_PAYLOAD_BYTES:
        raise Rejected(
            ErrorCode.INVALID_REQUEST,
            f"payload has {size} bytes; the limit is {MAX_PAYLOAD_BYTES}",
        )
    try:
        raw = json.loads(payload, parse_constant=_no_constant)
    except (json.JSONDecodeError, ValueError) as exc:
        raise Rejected(ErrorCode.MALFORMED_JSON, f"payload is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise Rejected(ErrorCode.MALFORMED_JSON, "payload must be a JSON object")
    return raw


def _no_constant(name: str) -> float:
    """JSON has no NaN or Infinity; Python's parser would take them."""
    raise ValueError(f"{name} is not a JSON value")


def _prompt_ids(spec: JobSpec, limits: PromptLimits) -> list[int]:
    if spec.tools is not None and spec.messages is None:
        raise InvalidRequestError("tools are rendered with chat messages: give messages")
    if spec.prompt_token_ids is not None:
        return list(spec.prompt_token_ids)
    _check_prompt_bytes(spec, limits)
    if spec.messages is not None:
        return encode_prompt(limits.tokenizer, spec.messages, tools=spec.tools)
    return encode_prompt(limits.tokenizer, spec.prompt or "")


def _check_prompt_bytes(spec: JobSpec, limits: PromptLimits) -> None:
    texts = [m.content for m in spec.messages] if spec.messages is not None else [spec.prompt]
    size = sum(len(t.encode("utf-8")) for t in texts if t)
    if size > limits.max_prompt_bytes:
        raise PromptTooLongError(
            f"the prompt has {size} bytes: more than this model's context of "
            f"{limits.max_model_len} tokens can hold, whatever its tokens"
        )


def _longest_token_bytes(tokenizer: Any) -> int:
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    return max((len(str(t).encode("utf-8", "replace")) for t in vocab), default=64) or 64


def _short(exc: ValidationError) -> str:
    parts = [f"{'.'.join(map(str, e['loc'])) or 'job'}: {e['msg']}" for e in exc.errors()[:5]]
    return "invalid job: " + "; ".join(parts)
