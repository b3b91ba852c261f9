"""OpenAI's response shapes, whole and as streamed chunks, built from the job's events.

``Shape`` holds what differs between ``/v1/completions`` and ``/v1/chat/completions`` (object
names, and ``text`` versus ``message``/``delta``), so one stream loop serves both.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
from redis.exceptions import RedisError

from gateway.errors import UNAVAILABLE_CODE, UNAVAILABLE_TYPE
from gateway.events import SSE_PING, follow, json_line, sse
from producer import AsyncProducer, JobResult, PaternosterError
from producer.protocol import DoneEvent, Event, TokenEvent, Usage


def finish_reason(reason: str | None) -> str | None:
    # A stop string is a stop to OpenAI; its clients know only "stop" and "length".
    return "stop" if reason == "stop_string" else reason


def usage_body(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    body: dict[str, Any] = usage.model_dump(include={"prompt_tokens", "completion_tokens"})
    body["total_tokens"] = usage.total_tokens
    body["prompt_tokens_details"] = {"cached_tokens": usage.cached_prompt_tokens}
    return body


@dataclass(frozen=True)
class Shape:
    """One response's identity and the choice layout of its endpoint."""

    job_id: str
    model: str
    chat: bool
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def id(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{self.job_id}"

    def envelope(self, choices: list[dict[str, Any]], *, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else None
        obj = kind or "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": choices}  # fmt: skip

    def choice(self, index: int, text: str | None, reason: str | None, *, chunk: bool) -> Any:
        body: dict[str, Any] = {"index": index}
        if not self.chat:
            body["text"] = text or ""
        elif chunk:
            body["delta"] = {} if text is None else {"role": "assistant", "content": text}
        else:
            body["message"] = {"role": "assistant", "content": text or ""}
        return {**body, "logprobs": None, "finish_reason": finish_reason(reason)}

    def whole(self, result: JobResult) -> dict[str, Any]:
        """The non-streamed response of a ``done`` job."""
        choices = [self.choice(c.choice, c.text, c.finish_reason, chunk=False)
                   for c in result.choices]  # fmt: skip
        return {**self.envelope(choices, chunk=False), "usage": usage_body(result.usage)}

    def chunks(self, event: Event) -> list[dict[str, Any]]:
        """The chunks one event becomes: a text delta, or the last chunk of each choice."""
        if isinstance(event, TokenEvent):
            delta = self.choice(event.choice, event.text, None, chunk=True)
            return [self.envelope([delta], chunk=True)] if event.text else []
        if isinstance(event, DoneEvent):
            ends = event.choices or ()
            reasons = {end.choice: end.finish_reason for end in ends} or {0: event.finish_reason}
            finals = [self.choice(i, None if self.chat else "", r, chunk=True)
                      for i, r in sorted(reasons.items())]  # fmt: skip
            return [self.envelope(finals, chunk=True)]
        return []


def error_chunk(event: Event) -> dict[str, Any]:
    """A job that ended without ``done`` mid-stream, or a stream that lost Redis for longer
    than the reconnect bound (``events.stream_lost``): OpenAI's SDKs raise on an ``error``
    key."""
    message = getattr(event, "message", None) or f"job ended: {event.type}"
    code = getattr(event, "code", event.type)
    type_ = UNAVAILABLE_TYPE if code == UNAVAILABLE_CODE else "job_ended"
    return {"error": {"message": message, "type": type_, "code": code, "param": None}}


async def openai_sse(
    producer: AsyncProducer,
    job_id: str,
    shape: Shape,
    *,
    include_usage: bool,
    cancel_on_disconnect: bool,
    idle_s: float,
) -> AsyncIterator[str]:
    """The job's chunks as OpenAI streams them, ``data: [DONE]`` last. A client that leaves
    early (the server cancels this generator) cancels the job, unless asked to keep it.
    ``job_id`` is the job plane's id; behind auth ``shape`` shows the client its own."""
    finished = False
    try:
        async for event in follow(producer, job_id, "0", idle_s):
            if event is None:
                yield SSE_PING
                continue
            for chunk in shape.chunks(event):
                yield sse(json_line(chunk))
            if isinstance(event, DoneEvent) and include_usage:
                yield sse(json_line({**shape.envelope([], chunk=True),
                                     "usage": usage_body(event.usage)}))  # fmt: skip
            elif event.type in ("error", "cancelled", "expired"):
                yield sse(json_line(error_chunk(event)))
        finished = True
        yield sse("[DONE]")
    finally:
        if not finished and cancel_on_disconnect:
            # Shielded: this runs inside the cancelled scope of the dead connection, and a
            # job nobody reads would otherwise hold a batch slot until max_tokens.
            with anyio.CancelScope(shield=True), contextlib.suppress(PaternosterError, RedisError):
                await producer.cancel(job_id)
