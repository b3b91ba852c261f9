"""``AsyncProducer``: the asyncio twin of ``Producer``, over ``redis.asyncio``: the same flows
(``producer.flows``), run with ``calls.adrive``."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import redis.asyncio as aredis

from producer import flows
from producer import requests as rq
from producer.base import HandleBase, ProducerBase
from producer.calls import IO, Flow, T, adrive, async_io
from producer.protocol import Event, JobSpec, UnknownEvent
from producer.reconnect import EventCursor
from producer.results import JobResult, JobStatus


class AsyncJobHandle(HandleBase["AsyncProducer"]):
    """A submitted job; ``stream()`` resumes after the last event it yielded."""

    async def status(self) -> JobStatus:
        return await self.producer.status(self.job_id)

    async def stream(self, timeout_s: float | None = None) -> AsyncIterator[Event]:
        async for event in self.producer.stream(self.job_id, self.last_event_id, timeout_s):
            self._seen(event.event_id)
            yield event

    async def result(self, timeout_s: float | None = None) -> JobResult:
        return await self.producer.result(self.job_id, timeout_s=timeout_s)

    async def cancel(self) -> str:
        return await self.producer.cancel(self.job_id)


class AsyncProducer(ProducerBase[aredis.Redis]):
    """Same arguments and meanings as ``Producer``; every call is a coroutine."""

    def _from_url(self, url: str) -> aredis.Redis:
        return aredis.Redis.from_url(url, decode_responses=True)

    def _make_io(self) -> IO:
        return async_io(self.redis, self._scripts())

    async def _run(self, flow: Flow[T]) -> T:
        return await adrive(flow, self._io)

    async def submit(self, prompt: str | None = None, **kwargs: Any) -> AsyncJobHandle:
        """As ``Producer.submit``: Overloaded when an admission limit refuses the job."""
        return await self.submit_spec(rq.build_spec(prompt, **kwargs))

    async def submit_spec(self, spec: JobSpec) -> AsyncJobHandle:
        return AsyncJobHandle(self, spec.id, await self._run(flows.submit(self.keys, spec)))

    async def status(self, job_id: str) -> JobStatus:
        return await self._run(flows.status(self.keys, job_id))

    async def cancel(self, job_id: str) -> str:
        return await self._run(flows.cancel(self.keys, job_id, self.result_ttl_s))

    async def events(
        self, job_id: str, from_event: str = "0", block_ms: int | None = None
    ) -> list[Event | UnknownEvent]:
        return await self._run(flows.events(self.keys, job_id, from_event, block_ms))

    async def next_events(self, cursor: EventCursor) -> list[Event]:
        """As ``Producer.next_events``."""
        return await self._run(flows.next_events(self.keys, cursor))

    async def batches(
        self, job_id: str, from_event: str = "0", timeout_s: float | None = None
    ) -> AsyncGenerator[list[Event], None]:
        """As ``Producer.batches``: the gateway's streams step with it too (``gateway.events``)."""
        cursor = self.cursor(job_id, from_event, timeout_s)
        while not cursor.finished:
            yield await self.next_events(cursor)
            cursor.check_deadline()

    async def stream(
        self, job_id: str, from_event: str = "0", timeout_s: float | None = None
    ) -> AsyncIterator[Event]:
        async for batch in self.batches(job_id, from_event, timeout_s):
            for event in batch:
                yield event

    async def result(self, job_id: str, timeout_s: float | None = None) -> JobResult:
        result = JobResult(job_id)
        async for event in self.stream(job_id, timeout_s=timeout_s):
            result.apply(event)
        return rq.raise_for_outcome(result)

    async def aclose(self) -> None:
        await self.redis.aclose()
        self._close_embedded()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
