"""Errors as HTTP responses: one JSON shape for both APIs, and a status for every client mistake.

The shape is OpenAI's (``{"error": {"message", "type", "code", "param"}}``) so its clients show
our messages as they show theirs; native-API errors add fields such as the job's ``state``.
"""

from __future__ import annotations

import math
from http import HTTPStatus
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from producer import InvalidJob, JobNotFound, JobTimeout
from producer.errors import JobEnded, JobFailed, Overloaded

# The worker's error codes that mean "your request", not "our failure" (protocol.ErrorCode).
CLIENT_ERROR_CODES = frozenset(
    {"malformed_json", "unsupported_schema_version", "invalid_request", "prompt_too_long",
     "invalid_prompt"}
)  # fmt: skip
# Redis away (restarting, failing over, unreachable): the 503's type and code, and the code of
# the error event a stream ends with when its outage outlasts the reconnect bound.
UNAVAILABLE_TYPE, UNAVAILABLE_CODE = "service_unavailable", "redis_unavailable"
# The smallest Retry-After the header allows: an outage is most often a restart, over in seconds.
UNAVAILABLE_RETRY_AFTER_S = 1


class ApiError(Exception):
    """Raised by a route to answer ``status`` with the error body; ``extra`` joins the body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        code: str | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.headers = headers
        self.status, self.message, self.type, self.code, self.extra = (
            status, message, type_, code, extra
        )  # fmt: skip

    def response(self) -> JSONResponse:
        body = {"message": self.message, "type": self.type, "code": self.code, "param": None}
        error = {"error": {**body, **self.extra}}
        return JSONResponse(error, status_code=self.status, headers=self.headers)


def job_ended_error(exc: JobEnded) -> ApiError:
    """The error for a job that ended without ``done``, carrying its state and partial text."""
    result = exc.result
    extra: dict[str, Any] = {"job_id": result.job_id, "state": str(result.state)}
    extra["text"] = result.text  # what it produced before it ended
    if isinstance(exc, JobFailed):
        client = exc.code in CLIENT_ERROR_CODES
        status, type_ = (400, "invalid_request_error") if client else (502, "worker_error")
        return ApiError(status, str(exc), type_=type_, code=exc.code, **extra)
    # Cancelled or expired: the request was fine, the job is gone; 409 says "not in that state".
    return ApiError(409, str(exc), type_="job_ended", code=str(result.state), **extra)


def overloaded_error(exc: Overloaded) -> ApiError:
    """429 with ``Retry-After`` (whole seconds, at least 1: the header takes no fractions).
    OpenAI's code for a 429, so its clients back off as they do for OpenAI; the body adds
    which limit refused the job."""
    retry_after = max(1, math.ceil(exc.retry_after_s))
    return ApiError(
        429,
        str(exc),
        type_="rate_limit_error",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(retry_after)},
        scope=exc.scope,
        kind=exc.kind,
        current=exc.current,
        limit=exc.limit,
    )


def unavailable_error() -> ApiError:
    """503 while Redis is away. The message names no host: redis-py's would tell any caller
    where the job plane lives."""
    return ApiError(
        503,
        "Redis is unavailable: the gateway cannot reach its job plane; retry shortly",
        type_=UNAVAILABLE_TYPE,
        code=UNAVAILABLE_CODE,
        headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)},
    )


def validation_message(exc: RequestValidationError) -> str:
    """One line naming each bad field, like the producer's ``validation_message``."""
    parts = []
    for e in list(exc.errors())[:5]:
        if e.get("type") == "json_invalid":  # its loc is a character offset, never filled in
            parts.append(f"body: not valid JSON: {e.get('ctx', {}).get('error', 'unreadable')}")
            continue
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "request"
        parts.append(f"{where}: {str(e.get('msg', 'invalid')).removeprefix('Value error, ')}")
    return "invalid request: " + "; ".join(parts)


def http_error(exc: HTTPException) -> ApiError:
    """What the framework raises itself (no such route 404, wrong method 405, a body it could
    not read 400), in the same shape as ours; the code is the status's name."""
    phrases = {s.value: s.phrase for s in HTTPStatus}
    phrase = phrases.get(exc.status_code, "error")
    type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
    code = phrase.lower().replace(" ", "_").replace("-", "_")
    message = exc.detail if isinstance(exc.detail, str) and exc.detail else phrase
    headers = dict(exc.headers) if exc.headers else None  # 405's Allow, 401's WWW-Authenticate
    return ApiError(exc.status_code, message, type_=type_, code=code, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return exc.response()

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return ApiError(422, validation_message(exc), code="validation_error").response()

    async def on_http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        return http_error(exc).response()

    async def on_invalid_job(_: Request, exc: Exception) -> JSONResponse:
        return ApiError(422, str(exc), code="invalid_job").response()

    async def on_not_found(_: Request, exc: Exception) -> JSONResponse:
        return ApiError(404, str(exc), code="job_not_found").response()

    async def on_timeout(_: Request, exc: Exception) -> JSONResponse:
        return ApiError(504, str(exc), type_="timeout", code="timeout").response()

    async def on_job_ended(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, JobEnded)
        return job_ended_error(exc).response()

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(InvalidJob, on_invalid_job)
    app.add_exception_handler(JobNotFound, on_not_found)
    app.add_exception_handler(JobTimeout, on_timeout)

    async def on_overloaded(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Overloaded)
        return overloaded_error(exc).response()

    async def on_unavailable(_: Request, exc: Exception) -> JSONResponse:
        return unavailable_error().response()

    app.add_exception_handler(JobEnded, on_job_ended)
    app.add_exception_handler(Overloaded, on_overloaded)
    # Streams ride out an outage (producer.reconnect); any other request fails at once.
    # RedisUnavailable is a redis.ConnectionError, so a result() past the bound lands here too.
    app.add_exception_handler(redis.ConnectionError, on_unavailable)
    app.add_exception_handler(redis.TimeoutError, on_unavailable)
