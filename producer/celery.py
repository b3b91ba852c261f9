"""Celery bridge: a ``paternoster.generate`` task that submits a job and returns its result.

Install with the ``celery`` extra; ``import producer`` never imports this module or Celery.

    app = Celery("web", broker=..., backend=...)
    generate = register(app, producer_factory=lambda: Producer(os.environ["REDIS_URL"]))
    chain(generate.s(prompt="Name a colour."), generate.s(template="Why {text}?")).delay()

The Paternoster worker itself is not a Celery worker, and cannot be: one process must own the
continuous batch (every running sequence shares one KV cache and steps together); Celery's
prefork pool forks children, and CUDA does not survive a fork; and Celery hands each task to one
pool slot, so tokens of different tasks could never share a forward pass. Celery tasks are the
*callers*: a task enqueues a job and waits on its result stream, which costs a thread, not a GPU.
See docs/celery.md.

The job id is the Celery task id (unless ``job_id`` is given), so a retried or redelivered task
resubmits the same id, which the protocol treats as the same job: never two generations.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import redis
from celery.exceptions import Ignore
from celery.signals import task_revoked

from producer import requests as rq
from producer.client import Producer
from producer.errors import (
    JobEnded,
    JobFailed,
    JobNotFound,
    JobTimeout,
    Overloaded,
    PaternosterError,
)
from producer.protocol import TokenEvent, is_terminal
from producer.results import JobResult

TASK_NAME = "paternoster.generate"
# Transient failures worth a retry: Redis away or slow. ``Overloaded`` (an admission limit
# refusing the job) is retried too, but not through these: it says when to come back, so the
# task retries it itself with ``overload_countdown`` (``register(retry_overloaded=False)``: not).
RETRY_ON: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError)
MAX_RETRIES = 8  # with backoff capped at 60 s: about 4 minutes of outage before giving up
RETRY_BACKOFF_MAX_S = 60
# How long one read waits before the task checks whether it was revoked: the delay between a
# revoke and the job's cancel request.
REVOKE_POLL_MS = 500


def overload_countdown(
    retry_after_s: float, retries: int, rand: Callable[[], float] = random.random
) -> float:
    """Seconds before retry number ``retries + 1`` of a refused submit: the refusal's
    ``retry_after_s`` doubled per earlier retry, capped at ``RETRY_BACKOFF_MAX_S``, plus up to
    half again at random, so tasks refused together do not all come back together. With the
    default 1 s and ``MAX_RETRIES`` 8: 183 to 275 s of overload before giving up."""
    base = min(float(RETRY_BACKOFF_MAX_S), retry_after_s * 2**retries)
    return base * (1.0 + 0.5 * rand())


class JobRevoked(PaternosterError):
    """The waiting side gave up (the Celery task was revoked); its job was asked to cancel."""


class GenerateFailed(PaternosterError):
    """What a ``paternoster.generate`` caller's ``get()`` raises when the job ended without
    ``done``. Celery rebuilds an exception from its args alone, which JobFailed (three of them,
    one a JobResult) does not survive: this one carries (message, state, error code), strings."""

    @property
    def state(self) -> str:  # error / cancelled / expired
        return str(self.args[1])

    @property
    def code(self) -> str | None:  # the worker's error code, for state "error"
        return self.args[2] if len(self.args) > 2 else None


def result_dict(result: JobResult) -> dict[str, Any]:
    """A JSON-serialisable result: what ``paternoster.generate`` returns to chains and chords."""
    out: dict[str, Any] = {
        "job_id": result.job_id,
        "text": result.text,
        "token_ids": list(result.token_ids),
        "finish_reason": result.finish_reason,
        "usage": result.usage.model_dump() if result.usage else None,
        "timings": result.timings.model_dump() if result.timings else None,
        "worker": result.worker,
    }
    if len(result.choices) > 1:
        out["choices"] = [
            {"text": c.text, "token_ids": list(c.token_ids), "finish_reason": c.finish_reason}
            for c in result.choices
        ]
    return out


def stream_tokens(
    producer: Producer,
    job_id: str,
    on_token: Callable[[TokenEvent], object] | None = None,
    *,
    should_stop: Callable[[], bool] | None = None,
    timeout_s: float | None = None,
    poll_ms: int = REVOKE_POLL_MS,
) -> JobResult:
    """Follow a job's events, calling ``on_token`` for each token event, until the job ends;
    its result, or the JobEnded error of its ending (see ``Producer.result``).

    ``should_stop`` is asked between reads (at least every ``poll_ms``): when it says True the
    job is cancelled and JobRevoked raised. Past ``timeout_s``: JobTimeout (the job lives on).
    Inside a Celery task, ``on_token`` may call
    ``self.update_state(state="PROGRESS", meta=...)`` or publish to a websocket.
    """
    result = JobResult(job_id)
    from_event = "0"
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    if not producer.redis.exists(producer.keys.job(job_id), producer.keys.events(job_id)):
        raise JobNotFound(job_id)
    while True:
        for event in producer.events(job_id, from_event, block_ms=poll_ms):
            from_event = event.event_id or from_event
            result.apply(event)
            if on_token is not None and isinstance(event, TokenEvent):
                on_token(event)
            if is_terminal(event):
                return rq.raise_for_outcome(result)
        if should_stop is not None and should_stop():
            producer.cancel(job_id)
            raise JobRevoked(f"job {job_id}: the waiting task was revoked; cancel requested")
        if deadline is not None and time.monotonic() >= deadline:
            raise JobTimeout(f"job {job_id} not finished within {timeout_s} s")


class _ProducerPerProcess:
    """One Producer per process, made on first use: a prefork child must not inherit its parent's
    sockets, and the pool's threads share one (redis-py's pool is thread-safe)."""

    def __init__(self, factory: Callable[[], Producer]) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._pid = -1
        self._producer: Producer | None = None

    def get(self) -> Producer:
        with self._lock:
            if self._producer is None or self._pid != os.getpid():
                self._producer, self._pid = self._factory(), os.getpid()
            return self._producer


def _revoked_in_this_worker(task_id: str) -> bool:
    """A plain ``revoke`` of a running task only adds its id to the worker's revoked set (the
    task keeps running). Threads, gevent and eventlet pools run tasks in the process holding
    that set, so polling it turns a revoke into a job cancel there."""
    from celery.worker import state

    return task_id in state.revoked


def register(
    app: Any,
    producer_factory: Callable[[], Producer],
    *,
    name: str = TASK_NAME,
    retry_on: tuple[type[BaseException], ...] = RETRY_ON,
    max_retries: int = MAX_RETRIES,
    retry_overloaded: bool = True,
    **task_options: Any,
) -> Any:
    """Register ``paternoster.generate`` on ``app``; returns the task.

    Keyword arguments of the task are ``Producer.submit``'s (``prompt``, ``messages``,
    ``max_tokens``, ``temperature``, ``job_id``, ``tenant``, ...), plus ``template``: in a chain,
    the previous task's result dict arrives as ``prompt`` and becomes ``template`` with
    ``{text}`` replaced by its text. ``timeout_s`` bounds the wait (the job is cancelled then).
    A submit refused by an admission limit (``Overloaded``) is retried after
    ``overload_countdown``, at most ``max_retries`` times, then the task fails with it.
    """
    producers = _ProducerPerProcess(producer_factory)
    options = _task_options(retry_on, max_retries, task_options)

    # shared=False: Celery's default adds every app.task to every app, so a second app in the
    # process (or a test's) would get this one's producer.
    @app.task(bind=True, name=name, shared=False, **options)
    def generate(
        self: Any,
        prompt: str | Mapping[str, Any] | None = None,
        *,
        template: str = "{text}",
        timeout_s: float | None = None,
        **submit_kwargs: Any,
    ) -> dict[str, Any]:
        if isinstance(prompt, Mapping):  # a previous generate's result, passed on by a chain
            prompt = template.replace("{text}", str(prompt.get("text", "")))
        producer = producers.get()
        job_id = submit_kwargs.pop("job_id", None) or self.request.id
        try:
            producer.submit(prompt, job_id=job_id, **submit_kwargs)
        except Overloaded as exc:
            if not retry_overloaded:
                raise
            countdown = overload_countdown(exc.retry_after_s, self.request.retries)
            raise self.retry(exc=exc, countdown=countdown) from exc
        return _wait(self, producer, job_id, timeout_s, retry_on)

    task_revoked.connect(_canceller(app, name, producers, retry_on), weak=False)
    return generate


def _task_options(
    retry_on: tuple[type[BaseException], ...], max_retries: int, overrides: Mapping[str, Any]
) -> dict[str, Any]:
    """The task's Celery options: retries with backoff on ``retry_on``, late acks."""
    return {
        "autoretry_for": retry_on,
        "retry_backoff": True,
        "retry_backoff_max": RETRY_BACKOFF_MAX_S,
        "retry_jitter": True,
        "max_retries": max_retries,
        # Safe because resubmitting is idempotent (job id = task id): a Celery worker that dies
        # mid-wait has its task redelivered, which follows the same job instead of losing it.
        "acks_late": True,
        **overrides,
    }


def _canceller(
    app: Any, name: str, producers: _ProducerPerProcess, retry_on: tuple[type[BaseException], ...]
) -> Callable[..., None]:
    """The ``task_revoked`` receiver that cancels a revoked task's job."""

    def on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
        # The worker's main process hears every revoke. With prefork and terminate=True the task
        # is killed before it can cancel anything, so cancel from here; for a task not started
        # yet this finds no job, or (a retry revoked) cancels the one an earlier try submitted.
        if request is None or getattr(sender, "name", None) != name:
            return
        if getattr(sender, "app", None) is not app:  # the same name on another app
            return
        job_id = (getattr(request, "kwargs", None) or {}).get("job_id") or request.id
        with contextlib.suppress(JobNotFound, *retry_on):
            producers.get().cancel(job_id)

    return on_revoked


def _wait(
    task: Any,
    producer: Producer,
    job_id: str,
    timeout_s: float | None,
    retry_on: tuple[type[BaseException], ...],
) -> dict[str, Any]:
    task_id = task.request.id

    def should_stop() -> bool:
        return not task.request.is_eager and _revoked_in_this_worker(task_id)

    try:
        result = stream_tokens(producer, job_id, should_stop=should_stop, timeout_s=timeout_s)
    except JobRevoked:
        # Record REVOKED, as Celery does for a task revoked before it ran, and keep the tracer
        # from overwriting it with FAILURE.
        task.backend.mark_as_revoked(task_id, "revoked", request=task.request)
        raise Ignore() from None
    except JobEnded as exc:  # the job ended on its own: the caller gets why
        code = exc.code if isinstance(exc, JobFailed) else None
        raise GenerateFailed(str(exc), exc.result.state.value, code) from exc
    except BaseException as exc:
        if isinstance(exc, retry_on):
            raise  # a retry will follow the same job
        # Timeout, soft time limit, worker shutdown, a bug: nobody will read this job's tokens.
        with contextlib.suppress(Exception):
            producer.cancel(job_id)
        raise
    return result_dict(result)
