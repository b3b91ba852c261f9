"""The producer's exceptions: one type per way a call can fail, all under ``PaternosterError``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import redis

if TYPE_CHECKING:
    from producer.results import JobResult


class PaternosterError(Exception):
    """Base of every error this library raises on purpose."""


class InvalidJob(PaternosterError, ValueError):
    """The job spec does not validate; nothing was enqueued."""


class JobNotFound(PaternosterError, KeyError):
    """No status hash for this id: never submitted, or ended longer ago than the result TTL."""

    def __str__(self) -> str:
        return f"no job {self.args[0]!r} (never submitted, or its result expired)"


class JobTimeout(PaternosterError, TimeoutError):
    """The job did not reach a terminal event within the caller's timeout; it is still alive."""


class JobEnded(PaternosterError):
    """The job ended without a ``done`` event; ``result`` holds what it produced before."""

    def __init__(self, message: str, result: JobResult) -> None:
        super().__init__(message)
        self.result = result


class JobFailed(JobEnded):
    """The job ended with an ``error`` event (``code`` and ``message`` from the worker)."""

    def __init__(self, code: str, message: str, result: JobResult) -> None:
        super().__init__(f"job {result.job_id} failed: {code}: {message}", result)
        self.code = code


class JobCancelled(JobEnded):
    """A client cancelled the job."""


class JobExpired(JobEnded):
    """The job's deadline passed before a worker started it."""


class NoRedis(PaternosterError):
    """No ``REDIS_URL`` and no embedded Redis available."""


class RedisUnavailable(PaternosterError, redis.ConnectionError):
    """A stream could not reach Redis for longer than its ``ReconnectPolicy.max_wait_s``
    (``producer.reconnect``); the job may well be running still: stream again from
    ``last_event_id`` to resume. Also a redis-py ``ConnectionError``, so code that caught that
    before catches this too; the last redis-py error is its ``__cause__``."""

    def __init__(self, message: str, *, job_id: str, last_event_id: str, waited_s: float) -> None:
        super().__init__(message)
        self.job_id, self.last_event_id, self.waited_s = job_id, last_event_id, waited_s


class Overloaded(PaternosterError):
    """An admission limit refused the job; nothing was enqueued. Submit again later (with the
    same id: submission is idempotent) after ``retry_after_s``.

    ``scope`` is what is full: ``band:<band>`` or ``tenant:<name>``; ``kind`` is ``jobs`` or
    ``tokens``; ``current`` is what that scope had queued and ``limit`` its limit (see
    ``producer.admission``).
    """

    def __init__(
        self, scope: str, kind: str, current: int, limit: int, retry_after_s: float
    ) -> None:
        super().__init__(scope, kind, current, limit, retry_after_s)
        self.scope, self.kind = scope, kind
        self.current, self.limit = current, limit
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        return (
            f"overloaded: {self.scope} has {self.current} {self.kind} queued, limit {self.limit};"
            f" retry after {self.retry_after_s:g} s"
        )
