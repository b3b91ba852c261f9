"""``AsyncProducer``: the asyncio twin of ``Producer``, over ``redis.asyncio``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aredis

from producer import envs, scripts, waiting
from producer import requests as rq
from producer.connection import open_client
from producer.errors import JobNotFound
from producer.keys import Keys, band_of
from producer.protocol import Event, JobSpec, JobState, UnknownEvent
from producer.reconnect import DEFAULT_RECONNECT, TRANSIENT_ERRORS, EventCursor, ReconnectPolicy
from producer.results import JobResult, JobStatus


class AsyncJobHandle:
    """A submitted job; ``stream()`` resumes after the last event it yielded."""

    def __init__(self, producer: AsyncProducer, job_id: str, created: bool) -> None:
        self.producer = producer
        self.job_id = job_id
        self.created = created
        self.last_event_id = "0"

    async def status(self) -> JobStatus:
        return await self.producer.status(self.job_id)

    async def stream(self, timeout_s: float | None = None) -> AsyncIterator[Event]:
        async for event in self.producer.stream(self.job_id, self.last_event_id, timeout_s):
            self.last_event_id = event.event_id or self.last_event_id
            yield event

    async def result(self, timeout_s: float | None = None) -> JobResult:
        return await self.producer.result(self.job_id, timeout_s=timeout_s)

    async def cancel(self) -> str:
        return await self.producer.cancel(self.job_id)


class AsyncProducer:
    """Same arguments and meanings as ``Producer``; every call is a coroutine."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        client: aredis.Redis | None = None,
        prefix: str | None = None,
        result_ttl_s: int = rq.DEFAULT_RESULT_TTL_S,
        reconnect: ReconnectPolicy = DEFAULT_RECONNECT,
    ) -> None:
        self.redis: aredis.Redis
        self.redis, self._embedded = open_client(
            redis_url, client, lambda url: aredis.Redis.from_url(url, decode_responses=True)
        )
        self.keys = Keys(prefix or envs.key_prefix())
        self.result_ttl_s = result_ttl_s
        self.reconnect = reconnect
        self._submit = self.redis.register_script(scripts.SUBMIT)
        self._cancel = self.redis.register_script(scripts.CANCEL)

    async def submit(self, prompt: str | None = None, **kwargs: Any) -> AsyncJobHandle:
        """As ``Producer.submit``: Overloaded when an admission limit refuses the job."""
        return await self.submit_spec(rq.build_spec(prompt, **kwargs))

    async def submit_spec(self, spec: JobSpec) -> AsyncJobHandle:
        keys, args = rq.submit_keys(self.keys, spec), rq.submit_args(spec)
        created = rq.submit_created(await self._submit(keys=keys, args=args))
        return AsyncJobHandle(self, spec.id, bool(created))

    async def status(self, job_id: str) -> JobStatus:
        fields: dict[str, str] = await self.redis.hgetall(self.keys.job(job_id))  # type: ignore[assignment]
        if not fields:
            raise JobNotFound(job_id)
        status = JobStatus.from_hash(job_id, fields)
        if status.state is not JobState.QUEUED or "stream_id" not in fields:
            return status
        band = status.band or band_of(status.priority or 0)  # no band: submitted by hand
        wait = await self._waiting(band, fields["stream_id"])
        return status.model_copy(
            update={"wait_reason": wait.wait_reason, "position": wait.position}
        )

    async def _waiting(self, band: str, stream_id: str) -> waiting.Waiting:
        """Why a queued job waits and its position (``producer.waiting``): two round trips."""
        pipe = self.redis.pipeline(transaction=False)
        waiting.ask_fleet(pipe, self.keys)
        names, queues = waiting.read_fleet(await pipe.execute(raise_on_error=False), self.keys)
        pipe = self.redis.pipeline(transaction=False)
        waiting.ask_position(pipe, self.keys, names, band, queues[band], stream_id)
        return waiting.waiting(await pipe.execute(raise_on_error=False), names, band, queues)

    async def cancel(self, job_id: str) -> str:
        keys = [self.keys.job(job_id), self.keys.events(job_id), self.keys.cancels]
        args = rq.cancel_args(job_id, self.result_ttl_s, self.keys.prefix)
        outcome = str(await self._cancel(keys=keys, args=args))
        if outcome == "missing":
            raise JobNotFound(job_id)
        return outcome

    async def events(
        self, job_id: str, from_event: str = "0", block_ms: int | None = None
    ) -> list[Event | UnknownEvent]:
        key = self.keys.events(job_id)
        reply: Any = await self.redis.xread({key: from_event}, count=rq.READ_COUNT, block=block_ms)
        return rq.parse_entries(rq.read_reply_entries(reply))

    def cursor(
        self, job_id: str, from_event: str = "0", timeout_s: float | None = None
    ) -> EventCursor:
        return EventCursor(job_id, from_event, timeout_s, self.reconnect)

    async def next_events(self, cursor: EventCursor) -> list[Event]:
        """As ``Producer.next_events``: the gateway's streams step with it too."""
        job_keys = self.keys.job(cursor.job_id), self.keys.events(cursor.job_id)
        try:
            if cursor.check_job and not await self.redis.exists(*job_keys):
                raise JobNotFound(cursor.job_id)
            batch = await self.events(cursor.job_id, cursor.from_event, cursor.block_ms())
        except TRANSIENT_ERRORS as exc:
            await asyncio.sleep(cursor.failed(exc))
            return []
        return cursor.accept(batch)

    async def stream(
        self, job_id: str, from_event: str = "0", timeout_s: float | None = None
    ) -> AsyncIterator[Event]:
        cursor = self.cursor(job_id, from_event, timeout_s)
        while not cursor.finished:
            for event in await self.next_events(cursor):
                yield event
            cursor.check_deadline()

    async def result(self, job_id: str, timeout_s: float | None = None) -> JobResult:
        result = JobResult(job_id)
        async for event in self.stream(job_id, timeout_s=timeout_s):
            result.apply(event)
        return rq.raise_for_outcome(result)

    async def aclose(self) -> None:
        await self.redis.aclose()
        if self._embedded is not None:
            self._embedded.close()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
