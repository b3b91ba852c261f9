"""OpenAI's response shapes, whole and as streamed chunks, built from the job's events.

``Shape`` holds what differs between ``/v1/completions`` and ``/v1/chat/completions`` (object
names, and ``text`` versus ``message``/``delta``), so one stream loop serves both.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from redis.exceptions import RedisError

from gateway.errors import UNAVAILABLE_CODE, UNAVAILABLE_TYPE
from gateway.events import SSE_PING, follow, json_line, sse
from gateway.openai_chunks import ChunkWriter
from gateway.openai_logprobs import (
    LogprobsByChoice,
    TextOffsets,
    chat_logprobs,
    completion_logprobs,
)
from gateway.openai_models import ChatCompletionRequest, OpenAIRequest
from gateway.tool_calls import ToolMode, calls_reason, tool_calls_body
from producer import AsyncProducer, JobResult, PaternosterError
from producer.protocol import DoneEvent, Event, TokenLogprob, Usage


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
    """One response's identity and the choice layout of its endpoint; ``tools`` says how a
    chat output becomes calls (None: content only), ``logprobs`` whether choices carry them."""

    job_id: str
    model: str
    chat: bool
    created: int = field(default_factory=lambda: int(time.time()))
    tools: ToolMode | None = None
    logprobs: bool = False
    # The one mutable part: a completion's text offsets go on from chunk to chunk.
    text_offsets: TextOffsets = field(default_factory=TextOffsets, compare=False)

    @classmethod
    def of(cls, body: OpenAIRequest, job_id: str, default_model: str) -> Shape:
        """The shape of ``body``'s response (a route's, or a batch line's)."""
        chat = isinstance(body, ChatCompletionRequest)
        tools = body.tool_mode() if isinstance(body, ChatCompletionRequest) else None
        logprobs = body.logprobs_count() is not None
        return cls(job_id, body.model or default_model, chat, tools=tools, logprobs=logprobs)

    @property
    def id(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{self.job_id}"

    def envelope(self, choices: list[dict[str, Any]], *, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else None
        obj = kind or "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": choices}  # fmt: skip

    def logprobs_body(
        self, index: int, logprobs: Sequence[TokenLogprob] | None
    ) -> dict[str, Any] | None:
        if not self.logprobs or logprobs is None:
            return None
        if self.chat:
            return chat_logprobs(logprobs)
        return completion_logprobs(logprobs, self.text_offsets.next(index, logprobs))

    def choice(
        self,
        index: int,
        body: dict[str, Any],
        reason: str | None,
        logprobs: Sequence[TokenLogprob] | None = None,
    ) -> dict[str, Any]:
        """A choice: ``body`` its ``text``, ``message`` or ``delta``."""
        return {"index": index, **body, "logprobs": self.logprobs_body(index, logprobs),
                "finish_reason": finish_reason(reason)}  # fmt: skip

    def message(self, text: str, reason: str | None) -> tuple[dict[str, Any], str | None]:
        """A whole chat choice's message, and its finish reason: ``tool_calls`` when the text
        held calls (``tool_calls.ToolMode``)."""
        content, calls = self.tools.parse(text) if self.tools is not None else (text, [])
        if not calls:
            return {"role": "assistant", "content": text}, reason
        message = {"role": "assistant", "content": content.strip() or None,
                   "tool_calls": tool_calls_body(calls)}  # fmt: skip
        return message, calls_reason(reason)

    def whole(self, result: JobResult, logprobs: LogprobsByChoice | None = None) -> dict[str, Any]:
        """The non-streamed response of a ``done`` job."""
        choices = []
        for c in result.choices:
            reason: str | None = c.finish_reason
            body: dict[str, Any]
            if self.chat:
                message, reason = self.message(c.text, reason)
                body = {"message": message}
            else:
                body = {"text": c.text}
            lps = None if logprobs is None else logprobs.of(c.choice)
            choices.append(self.choice(c.choice, body, reason, lps))
        return {**self.envelope(choices, chunk=False), "usage": usage_body(result.usage)}


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
    finished, writer = False, ChunkWriter(shape)
    try:
        async for event in follow(producer, job_id, "0", idle_s):
            if event is None:
                yield SSE_PING
                continue
            for chunk in writer.chunks(event):
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
