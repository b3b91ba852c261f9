"""A batch's input file as jobs, and each job's end as a line of the output or error file.

Each input line is ``{"custom_id", "method": "POST", "url": <the batch's endpoint>, "body"}``.
Its body is converted by the same code as the endpoint's route (``openai_models``: the request
model, ``prompt_fields``, ``sampling``, then ``build_spec``), so a line asks for exactly what
the same request sent one by one would. A line whose method, url or body is refused becomes an
error line with the status and error body the route would have answered, and the batch goes
on. What makes the file as a whole unusable (not JSON lines, a line without a string
``custom_id``, a ``custom_id`` twice, no lines, too many) fails the batch in ``validating``,
with each problem in the batch's ``errors``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from gateway.errors import ApiError, job_ended_error, validation_message
from gateway.openai_models import ChatCompletionRequest, CompletionRequest
from gateway.openai_stream import Shape
from producer import InvalidJob, JobResult, JobSpec
from producer.errors import JobEnded
from producer.protocol import JobState
from producer.requests import build_spec

# The endpoints a batch may target, with their request model and whether it is chat.
LineBody = ChatCompletionRequest | CompletionRequest
ENDPOINTS: dict[str, tuple[type[ChatCompletionRequest] | type[CompletionRequest], bool]] = {
    "/v1/chat/completions": (ChatCompletionRequest, True),
    "/v1/completions": (CompletionRequest, False),
}
MAX_BATCH_LINES = 50_000  # OpenAI's limit of requests in one batch
MAX_FILE_ERRORS = 20  # problems a failed batch lists (the first ones)
# What a line that never ran says, by why (OpenAI's code for the first).
NOT_RUN = {
    "batch_expired": "the request could not run before the batch's completion window ended",
    "batch_cancelled": "the batch was cancelled before the request ran",
}


@dataclass(frozen=True)
class BatchLine:
    """One input line: its job (None when the line was refused, then ``error`` says why)."""

    index: int
    custom_id: str
    spec: JobSpec | None = None
    model: str | None = None  # the body's model, echoed in its response
    error: ApiError | None = None


@dataclass(frozen=True)
class LineJob:
    """What every line of one batch shares: the endpoint and what its jobs are submitted as."""

    endpoint: str
    owner: str | None  # the caller's tenant (None without auth: a line's `user` names it)
    deadline: float  # the end of the completion window: JobSpec.deadline of every job
    default_max_tokens: int

    def spec(self, body: LineBody, job_id: str) -> JobSpec:
        """The line's job, as ``openai_api.run_openai`` builds the route's."""
        if body.stream:
            raise ApiError(422, "stream: not supported in a batch", param="stream")
        fields = {**body.prompt_fields(), **body.sampling(body.token_limit,
                                                          self.default_max_tokens)}  # fmt: skip
        tenant = self.owner if self.owner is not None else body.user
        return build_spec(**fields, job_id=job_id, tenant=tenant, priority="batch",
                          deadline=self.deadline, webhook=body.webhook)  # fmt: skip


@dataclass
class ParsedInput:
    lines: list[BatchLine] = field(default_factory=list)
    problems: list[dict[str, Any]] = field(default_factory=list)  # the batch's errors.data


def _problem(code: str, message: str, line: int | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": None, "line": line}


def _line(index: int, raw: dict[str, Any], job: LineJob, job_id: str) -> BatchLine:
    custom_id = raw["custom_id"]
    model_type, _ = ENDPOINTS[job.endpoint]
    try:
        if raw.get("method") != "POST":
            raise ApiError(422, "method: must be POST", param="method")
        if raw.get("url") != job.endpoint:
            raise ApiError(422, f"url: must be the batch's endpoint {job.endpoint}", param="url")
        body = model_type.model_validate(raw.get("body"))
        return BatchLine(index, custom_id, job.spec(body, job_id), body.model)
    except ValidationError as exc:
        message = validation_message(RequestValidationError(exc.errors()))
        error = ApiError(422, message, code="validation_error")
    except InvalidJob as exc:
        error = ApiError(422, str(exc), code="invalid_job")
    except ApiError as exc:
        error = exc
    return BatchLine(index, custom_id, error=error)


def parse_input(content: bytes, job: LineJob, job_id: Callable[[int], str]) -> ParsedInput:
    """The lines of an input file (``job_id(i)``: the job of line i, from the batch's id),
    or the problems that fail the batch."""
    parsed, seen = ParsedInput(), set()
    rows = [r for r in content.decode(errors="replace").splitlines() if r.strip()]
    if not rows or len(rows) > MAX_BATCH_LINES:
        count = f"{len(rows)} requests" if rows else "no requests"
        parsed.problems.append(_problem("invalid_file", f"{count}; 1 to {MAX_BATCH_LINES}"))
        return parsed
    for index, row in enumerate(rows):
        try:
            raw = json.loads(row)
        except json.JSONDecodeError as exc:
            raw = exc.msg
        if not isinstance(raw, dict) or not isinstance(raw.get("custom_id"), str):
            what = f"not JSON: {raw}" if isinstance(raw, str) else "no string custom_id"
            parsed.problems.append(_problem("invalid_json_line", what, index + 1))
        elif raw["custom_id"] in seen:
            message = f"custom_id {raw['custom_id']!r} appears twice"
            parsed.problems.append(_problem("duplicate_custom_id", message, index + 1))
        else:
            seen.add(raw["custom_id"])
            parsed.lines.append(_line(index, raw, job, job_id(index)))
    parsed.problems = parsed.problems[:MAX_FILE_ERRORS]
    return parsed


def _record(line: BatchLine, response: dict[str, Any] | None, error: Any) -> str:
    record = {"id": f"batch_req_{line.index}_{line.custom_id}"[:128], "custom_id": line.custom_id,
              "response": response, "error": error}  # fmt: skip
    return json.dumps(record, ensure_ascii=False)


def refused_line(line: BatchLine, request_id: str | None) -> str:
    """The error line of a line refused at validation: the route's status and error body."""
    assert line.error is not None
    body = json.loads(bytes(line.error.response().body))
    return _record(line, {"status_code": line.error.status, "request_id": request_id,
                          "body": body}, None)  # fmt: skip


def error_line(line: BatchLine, code: str, message: str) -> str:
    """The error line of a request without a response."""
    return _record(line, None, {"code": code, "message": message})


def not_run_line(line: BatchLine, code: str) -> str:
    """The error line of a request the batch never ran (``NOT_RUN``)."""
    return error_line(line, code, NOT_RUN[code])


def result_line(
    line: BatchLine,
    result: JobResult,
    request_id: str,
    shape: Shape,
    ended: JobEnded | None,
    cancelled_code: str = "batch_cancelled",
) -> tuple[bool, str]:
    """Whether the request succeeded, and its line: the route's whole response for a ``done``
    job; its error answer for an ``error``; ``NOT_RUN`` for one expired, or cancelled (by the
    batch's cancel, or at the end of its window: ``cancelled_code`` says which)."""
    if ended is None:
        body = shape.whole(result)
        return True, _record(line, {"status_code": 200, "request_id": request_id,
                                    "body": body}, None)  # fmt: skip
    if result.state is JobState.EXPIRED:
        return False, not_run_line(line, "batch_expired")
    if result.state is JobState.CANCELLED:
        return False, not_run_line(line, cancelled_code)
    error = job_ended_error(ended)
    body = json.loads(bytes(error.response().body))
    return False, _record(line, {"status_code": error.status, "request_id": request_id,
                                 "body": body}, None)  # fmt: skip
