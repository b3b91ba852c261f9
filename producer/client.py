"""``Producer``: the synchronous client web apps use to submit, follow and cancel jobs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import redis

from producer import envs, scripts, waiting
from producer import requests as rq
from producer.connection import open_client
from producer.errors import JobNotFound
from producer.keys import Keys, band_of
from producer.protocol import Event, JobSpec, JobState, UnknownEvent
from producer.reconnect import DEFAULT_RECONNECT, TRANSIENT_ERRORS, EventCursor, ReconnectPolicy
from producer.results import JobResult, JobStatus


class JobHandle:
    """A submitted job. ``stream()`` resumes after the last event it yielded."""

    def __init__(self, producer: Producer, job_id: str, created: bool) -> None:
        self.producer = producer
        self.job_id = job_id
        self.created = created  # False: a job with this id already existed; nothing was added
        self.last_event_id = "0"

    def status(self) -> JobStatus:
        return self.producer.status(self.job_id)

    def stream(self, timeout_s: float | None = None) -> Iterator[Event]:
        for event in self.producer.stream(self.job_id, self.last_event_id, timeout_s=timeout_s):
            self.last_event_id = event.event_id or self.last_event_id
            yield event

    def result(self, timeout_s: float | None = None) -> JobResult:
        return self.producer.result(self.job_id, timeout_s=timeout_s)

    def cancel(self) -> str:
        return self.producer.cancel(self.job_id)

    def __repr__(self) -> str:
        return f"JobHandle({self.job_id!r}, created={self.created})"


class Producer:
    """Submit jobs to the jobs stream and read their result streams, over redis-py.

    ``redis_url`` defaults to ``REDIS_URL``, else an embedded Redis; ``prefix`` to
    ``PATERNOSTER_PREFIX``, else ``paternoster``. Pass ``client`` to reuse a connection pool.
    ``reconnect`` bounds how long ``stream`` and ``result`` ride out a Redis outage.
    """

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        client: redis.Redis | None = None,
        prefix: str | None = None,
        result_ttl_s: int = rq.DEFAULT_RESULT_TTL_S,
        reconnect: ReconnectPolicy = DEFAULT_RECONNECT,
    ) -> None:
        self.redis: redis.Redis
        self.redis, self._embedded = open_client(
            redis_url, client, lambda url: redis.Redis.from_url(url, decode_responses=True)
        )
        self.keys = Keys(prefix or envs.key_prefix())
        self.result_ttl_s = result_ttl_s
        self.reconnect = reconnect
        self._submit = self.redis.register_script(scripts.SUBMIT)
        self._cancel = self.redis.register_script(scripts.CANCEL)

    def submit(self, prompt: str | None = None, **kwargs: Any) -> JobHandle:
        """Enqueue a job (see ``requests.build_spec`` for the arguments). Submitting an id that
        exists returns a handle to the existing job with ``created`` False. Overloaded when an
        admission limit refuses it (``producer.admission``): nothing was enqueued."""
        return self.submit_spec(rq.build_spec(prompt, **kwargs))

    def submit_spec(self, spec: JobSpec) -> JobHandle:
        keys, args = rq.submit_keys(self.keys, spec), rq.submit_args(spec)
        created = rq.submit_created(self._submit(keys=keys, args=args))
        return JobHandle(self, spec.id, bool(created))

    def status(self, job_id: str) -> JobStatus:
        """The job's status hash; for a queued job also ``wait_reason`` and ``position``."""
        fields: dict[str, str] = self.redis.hgetall(self.keys.job(job_id))  # type: ignore[assignment]
        if not fields:
            raise JobNotFound(job_id)
        status = JobStatus.from_hash(job_id, fields)
        if status.state is not JobState.QUEUED or "stream_id" not in fields:
            return status
        band = status.band or band_of(status.priority or 0)  # no band: submitted by hand
        wait = self._waiting(band, fields["stream_id"])
        return status.model_copy(
            update={"wait_reason": wait.wait_reason, "position": wait.position}
        )

    def _waiting(self, band: str, stream_id: str) -> waiting.Waiting:
        """Why a queued job waits and its position (``producer.waiting``): two round trips."""
        pipe = self.redis.pipeline(transaction=False)
        waiting.ask_fleet(pipe, self.keys)
        names, queues = waiting.read_fleet(pipe.execute(raise_on_error=False), self.keys)
        pipe = self.redis.pipeline(transaction=False)
        waiting.ask_position(pipe, self.keys, names, band, queues[band], stream_id)
        return waiting.waiting(pipe.execute(raise_on_error=False), names, band, queues)

    def cancel(self, job_id: str) -> str:
        """Cancel a job: "cancelled" (it was queued and is now ended), "cancelling" (its worker
        stops it within a step), or the terminal state it already had."""
        keys = [self.keys.job(job_id), self.keys.events(job_id), self.keys.cancels]
        args = rq.cancel_args(job_id, self.result_ttl_s, self.keys.prefix)
        outcome = str(self._cancel(keys=keys, args=args))
        if outcome == "missing":
            raise JobNotFound(job_id)
        return outcome

    def events(
        self, job_id: str, from_event: str = "0", block_ms: int | None = None
    ) -> list[Event | UnknownEvent]:
        """One read of the events after ``from_event``; waits up to ``block_ms`` for the first."""
        key = self.keys.events(job_id)
        reply: Any = self.redis.xread({key: from_event}, count=rq.READ_COUNT, block=block_ms)
        return rq.parse_entries(rq.read_reply_entries(reply))

    def cursor(
        self, job_id: str, from_event: str = "0", timeout_s: float | None = None
    ) -> EventCursor:
        """Where a stream of the job's events starts, for ``next_events``."""
        return EventCursor(job_id, from_event, timeout_s, self.reconnect)

    def next_events(self, cursor: EventCursor) -> list[Event]:
        """One step of a stream: the events after the cursor (waiting up to a second for them),
        or none after a failed read and its backoff. JobNotFound when the job is gone;
        RedisUnavailable when an outage outlasts ``reconnect.max_wait_s``."""
        job_keys = self.keys.job(cursor.job_id), self.keys.events(cursor.job_id)
        try:
            if cursor.check_job and not self.redis.exists(*job_keys):
                raise JobNotFound(cursor.job_id)
            batch = self.events(cursor.job_id, cursor.from_event, block_ms=cursor.block_ms())
        except TRANSIENT_ERRORS as exc:
            time.sleep(cursor.failed(exc))
            return []
        return cursor.accept(batch)

    def stream(
        self, job_id: str, from_event: str = "0", timeout_s: float | None = None
    ) -> Iterator[Event]:
        """Yield the job's events after ``from_event`` (a stream entry id; "0": from the start) as
        they are published, until the terminal one. A Redis outage delays events, never repeats
        one (``producer.reconnect``); to resume later, pass the last ``event_id``."""
        cursor = self.cursor(job_id, from_event, timeout_s)
        while not cursor.finished:
            yield from self.next_events(cursor)
            cursor.check_deadline()

    def result(self, job_id: str, timeout_s: float | None = None) -> JobResult:
        """Block until the job ends; its text and usage, or JobFailed / JobCancelled / JobExpired
        (each carrying the partial result); JobTimeout if ``timeout_s`` passes first."""
        result = JobResult(job_id)
        for event in self.stream(job_id, timeout_s=timeout_s):
            result.apply(event)
        return rq.raise_for_outcome(result)

    def close(self) -> None:
        self.redis.close()
        if self._embedded is not None:
            self._embedded.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
