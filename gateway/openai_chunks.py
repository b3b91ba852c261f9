"""The chunks a streamed OpenAI response is made of, event by event (``openai_stream``).

A ``ChunkWriter`` lives for one stream: with tools, each choice's text goes through a
``tool_calls.ToolStream``, which turns it into content and ``delta.tool_calls`` chunks (per call
one with its id, type and name, then its arguments: as they are written for ``required`` and a
named function, whose outputs are calls by construction, at the choice's end for ``auto``, whose
text is held while it may be a call) and ends a choice that made calls with ``tool_calls``.
Logprobs ride on the first chunk of the tokens they belong to (a chunk with an empty delta while
the text is held).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.tool_calls import ToolStream, calls_reason
from producer.protocol import DoneEvent, Event, TokenEvent

if TYPE_CHECKING:
    from gateway.openai_stream import Shape


class ChunkWriter:
    """The chunks of one stream's events, in order."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.streams: dict[int, ToolStream] = {}

    def chunks(self, event: Event) -> list[dict[str, Any]]:
        """What one event becomes: deltas of text (or of calls), or each choice's last."""
        if isinstance(event, TokenEvent):
            return self._token(event)
        if isinstance(event, DoneEvent):
            ends = event.choices or ()
            reasons = {end.choice: end.finish_reason for end in ends} or {0: event.finish_reason}
            return self._ends({i: str(r) for i, r in reasons.items()})
        return []

    def _stream(self, choice: int) -> ToolStream | None:
        if self.shape.tools is None:
            return None
        return self.streams.setdefault(choice, ToolStream(self.shape.tools))

    def _chunk(self, choice: int, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return self.shape.envelope([self.shape.choice(choice, body, None, **kw)], chunk=True)

    def _token(self, event: TokenEvent) -> list[dict[str, Any]]:
        logprobs = event.logprobs if self.shape.logprobs else None
        if not self.shape.chat:
            if not event.text and not logprobs:
                return []
            return [self._chunk(event.choice, {"text": event.text}, logprobs=logprobs)]
        stream = self._stream(event.choice)
        text, calls = (event.text, []) if stream is None else stream.feed(event.text)
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": text}] if text else []
        deltas += [{"tool_calls": c} for c in calls]
        if not deltas and logprobs:
            deltas = [{}]
        return [self._chunk(event.choice, {"delta": d}, logprobs=logprobs if i == 0 else None)
                for i, d in enumerate(deltas)]  # fmt: skip

    def _ends(self, reasons: dict[int, str]) -> list[dict[str, Any]]:
        chunks, finals = [], []
        for index, reason in sorted(reasons.items()):
            stream = self._stream(index) if self.shape.chat else None
            if stream is not None:
                rest, calls, called = stream.finish()
                if rest:
                    delta = {"role": "assistant", "content": rest}
                    chunks.append(self._chunk(index, {"delta": delta}))
                for calls_delta in calls:
                    chunks.append(self._chunk(index, {"delta": {"tool_calls": calls_delta}}))
                reason = calls_reason(reason) if called else reason
            last: dict[str, Any] = {"delta": {}} if self.shape.chat else {"text": ""}
            finals.append(self.shape.choice(index, last, reason))
        return [*chunks, self.shape.envelope(finals, chunk=True)]
