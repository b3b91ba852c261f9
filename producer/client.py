"""``Producer``: the synchronous client web apps use to submit, follow and cancel jobs.

Each operation is a flow of ``producer.flows`` run on redis-py (``calls.drive``); the asyncio
client runs the same flows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import redis

from producer import flows
from producer import requests as rq
from producer.base import HandleBase, ProducerBase
from producer.calls import IO, Flow, T, drive
from producer.protocol import Event, JobSpec, UnknownEvent
from producer.reconnect import EventCursor
from producer.results import JobResult, JobStatus


class JobHandle(HandleBase["Producer"]):
    """A submitted job. ``stream()`` resumes after the last event it yielded."""

    def status(self) -> JobStatus:
        return self.producer.status(self.job_id)

    def stream(self, timeout_s: float | None = None) -> Iterator[Event]:
        for event in self.producer.stream(self.job_id, self.last_event_id, timeout_s=timeout_s):
            self._seen(event.event_id)
            yield event

    def result(self, timeout_s: float | None = None) -> JobResult:
        return self.producer.result(self.job_id, timeout_s=timeout_s)

    def cancel(self) -> str:
        return self.producer.cancel(self.job_id)


class Producer(ProducerBase[redis.Redis]):
    """Submit jobs to the jobs stream and read their result streams, over redis-py.

    ``redis_url`` defaults to ``REDIS_URL``, else an embedded Redis; ``prefix`` to
    ``PATERNOSTER_PREFIX``, else ``paternoster``. Pass ``client`` to reuse a connection pool.
    ``reconnect`` bounds how long ``stream`` and ``result`` ride out a Redis outage.
    """

    def _from_url(self, url: str) -> redis.Redis:
        return redis.Redis.from_url(url, decode_responses=True)

    def _make_io(self) -> IO:
        return IO(self.redis, self._scripts())

    def _run(self, flow: Flow[T]) -> T:
        return drive(flow, self._io)

    def submit(self, prompt: str | None = None, **kwargs: Any) -> JobHandle:
        """Enqueue a job (see ``requests.build_spec`` for the arguments). Submitting an id that
        exists returns a handle to the existing job with ``created`` False. Overloaded when an
        admission limit refuses it (``producer.admission``): nothing was enqueued."""
        return self.submit_spec(rq.build_spec(prompt, **kwargs))

    def submit_spec(self, spec: JobSpec) -> JobHandle:
        return JobHandle(self, spec.id, self._run(flows.submit(self.keys, spec)))

    def status(self, job_id: str) -> JobStatus:
        """The job's status hash; for a queued job also ``wait_reason`` and ``position``."""
        return self._run(flows.status(self.keys, job_id))

    def cancel(self, job_id: str) -> str:
        """Cancel a job: "cancelled" (it was queued and is now ended), "cancelling" (its worker
        stops it within a step), or the terminal state it already had."""
        return self._run(flows.cancel(self.keys, job_id, self.result_ttl_s))

    def events(
        self, job_id: str, from_event: str = "0", block_ms: int | None = None
    ) -> list[Event | UnknownEvent]:
        """One read of the events after ``from_event``; waits up to ``block_ms`` for the first."""
        return self._run(flows.events(self.keys, job_id, from_event, block_ms))

    def next_events(self, cursor: EventCursor) -> list[Event]:
        """One step of a stream: the events after the cursor (waiting up to a second for them),
        or none after a failed read and its backoff. JobNotFound when the job is gone;
        RedisUnavailable when an outage outlasts ``reconnect.max_wait_s``."""
        return self._run(flows.next_events(self.keys, cursor))

    def batches(
        self, job_id: str, from_event: str = "0", timeout_s: float | None = None
    ) -> Iterator[list[Event]]:
        """Each step's events (none after a read that found none or failed), until the terminal
        one; JobTimeout once ``timeout_s`` has passed without it."""
        cursor = self.cursor(job_id, from_event, timeout_s)
        while not cursor.finished:
            yield self.next_events(cursor)
            cursor.check_deadline()

    def stream(
        self, job_id: str, from_event: str = "0", timeout_s: float | None = None
    ) -> Iterator[Event]:
        """Yield the job's events after ``from_event`` (a stream entry id; "0": from the start) as
        they are published, until the terminal one. A Redis outage delays events, never repeats
        one (``producer.reconnect``); to resume later, pass the last ``event_id``."""
        for batch in self.batches(job_id, from_event, timeout_s):
            yield from batch

    def result(self, job_id: str, timeout_s: float | None = None) -> JobResult:
        """Block until the job ends; its text and usage, or JobFailed / JobCancelled / JobExpired
        (each carrying the partial result); JobTimeout if ``timeout_s`` passes first."""
        result = JobResult.from_events(job_id, self.stream(job_id, timeout_s=timeout_s))
        return rq.raise_for_outcome(result)

    def close(self) -> None:
        self.redis.close()
        self._close_embedded()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
