"""Following a job's result stream for HTTP: events as they come, idle ticks, SSE framing.

Both APIs stream from here: the native ``/events`` endpoint frames each Redis event as one SSE
(``id:`` the entry id, so a browser's EventSource resumes by itself with ``Last-Event-ID``), and
the OpenAI endpoints turn the same events into chunks.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from gateway.errors import UNAVAILABLE_CODE
from producer import AsyncProducer, JobNotFound, RedisUnavailable
from producer.protocol import ErrorEvent, Event

# A Redis stream entry id ("1700000000000-0") or a bare millisecond time; anything else makes
# XREAD fail with a server error, so it is refused up front as the client's mistake. Each part
# is a uint64 in Redis: 19 digits always fit, 20 may not.
EVENT_ID_PATTERN = re.compile(r"^\d{1,19}(-\d{1,19})?$")


async def follow(
    producer: AsyncProducer, job_id: str, from_event: str = "0", idle_s: float = 15.0
) -> AsyncIterator[Event | None]:
    """The job's events after ``from_event`` until the terminal one; ``None`` after each
    ``idle_s`` without an event (the caller writes a keep-alive); it steps with
    ``AsyncProducer.batches``, which rides out a Redis outage (``producer.reconnect``); one
    past its bound, or a job gone when Redis came back, ends the stream with ``stream_lost``'s
    event instead of cutting the connection."""
    last_sent = time.monotonic()
    try:
        async with aclosing(producer.batches(job_id, from_event)) as batches:
            async for batch in batches:
                for event in batch:
                    yield event
                now = time.monotonic()
                if batch:
                    last_sent = now
                elif now - last_sent >= idle_s:  # pings go on through an outage: clients stay
                    last_sent = now
                    yield None
    except (RedisUnavailable, JobNotFound) as exc:
        yield stream_lost(exc)


def stream_lost(exc: RedisUnavailable | JobNotFound) -> ErrorEvent:
    """The last event of a stream that lost its job, not of a job that failed: the job may run
    on. No ``event_id``, so the SSE has no ``id:`` and a client resumes after the last real one."""
    if isinstance(exc, JobNotFound):
        # No id in the message: behind auth the stored id is tenant-scoped, not the client's.
        return ErrorEvent(code="job_not_found", message="the job is gone after Redis came back")
    return ErrorEvent(
        code=UNAVAILABLE_CODE,
        message=f"lost Redis for {exc.waited_s:.1f} s, longer than this gateway waits; the job"
        f" may still be running: resume after event {exc.last_event_id}",
    )


def sse(data: str, *, event: str | None = None, event_id: str | None = None) -> str:
    """One server-sent event; ``data`` must be a single line (compact JSON is)."""
    head = (f"id: {event_id}\n" if event_id else "") + (f"event: {event}\n" if event else "")
    return f"{head}data: {data}\n\n"


SSE_PING = ": ping\n\n"  # a comment line: EventSource ignores it, proxies see traffic


def event_sse(event: Event) -> str:
    """The native framing: ``data`` is the event's JSON exactly as the worker published it."""
    data = event.model_dump_json(exclude_none=True)
    return sse(data, event=event.type, event_id=event.event_id)


def json_line(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # nginx: do not buffer
