"""A chat completion's output as tool calls: how each ``tool_choice`` reads the model's text.

- ``auto``: free text, read for calls in the formats models are trained on (docs/gateway.md#tool-
  calls): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Hermes, Qwen, and
  the generic template ``worker.engine.chat_tools`` prompts for), or the whole output one such
  JSON object or a list of them (Llama 3.1's ``parameters`` is read as ``arguments``). Only
  calls to the request's functions count; text around the blocks stays ``content``.
- ``required``: the output was constrained to a JSON array of ``{name, arguments}``.
- a named function: the output was constrained to that function's arguments.

A constrained call's ``arguments`` is the model's own text (the span of the value it wrote), so
a stream can send it as it is written (``ToolStream``) and the same request unstreamed answers
the same string. An output cut by ``max_tokens`` (finish reason ``length``) gives the calls made
whole before the cut (the items of ``required``'s array that closed), or none and its text as
``content``: never a call that would not parse. (Streamed, a call already under way when the
cut came has been sent in part, as OpenAI's streams do.)
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from gateway.call_scanner import CallScanner
from producer.messages import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

ToolKind = Literal["auto", "required", "named"]
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + "|$)",
                    re.DOTALL)  # fmt: skip


class Call(NamedTuple):
    """One parsed call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ToolMode:
    """How a request's output becomes calls: ``kind``, the functions it may call (for
    ``named``, the one), and whether more than one call is allowed."""

    kind: ToolKind
    names: tuple[str, ...]
    parallel: bool = True

    def parse(self, text: str) -> tuple[str, list[Call]]:
        """The output's content (what is not a call, unstripped: a stream sent its start
        already) and its calls; no calls: the whole text is content."""
        if self.kind == "named":
            arguments = text.strip()
            whole = isinstance(_json(arguments), dict)
            return ("", [Call(self.names[0], arguments)]) if whole else (text, [])
        if self.kind == "required":
            scanner = CallScanner()
            scanner.feed(text)
            calls = [Call(c.name or "", scanner.arguments(c)) for c in scanner.calls if c.closed]
            valid = all(c.name in self.names and isinstance(_json(c.arguments), dict)
                        for c in calls)  # fmt: skip
            return ("", calls) if calls and valid else (text, [])
        return self._auto(text)

    def _auto(self, text: str) -> tuple[str, list[Call]]:
        if TOOL_CALL_OPEN in text:
            found = [self._calls(_json(body)) for body in _BLOCK.findall(text)]
            calls = [c for block in found for c in block]
            if calls and all(found):  # a block that is no call of ours leaves the text as it is
                return self._limit(_BLOCK.sub("", text), calls)
            return text, []
        calls = self._calls(_json(text)) if text.strip()[:1] in ("{", "[") else []
        return self._limit("", calls) if calls else (text, [])

    def _limit(self, content: str, calls: list[Call]) -> tuple[str, list[Call]]:
        # parallel_tool_calls false: the first call only, as OpenAI's models make one.
        return content, calls if self.parallel else calls[:1]

    def _calls(self, value: Any) -> list[Call]:
        """Calls from a ``{name, arguments}`` object or a list of them; [] unless every one
        names one of our functions with an object of arguments."""
        items = value if isinstance(value, list) else [value]
        calls = []
        for item in items:
            if not isinstance(item, dict) or item.get("name") not in self.names:
                return []
            arguments = item.get("arguments", item.get("parameters", {}))
            if not isinstance(arguments, dict):
                return []
            calls.append(_call(item["name"], arguments))
        return calls


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _call(name: str, arguments: dict[str, Any]) -> Call:
    return Call(name, json.dumps(arguments, ensure_ascii=False))


def calls_reason(reason: str | None) -> str:
    """The finish reason of a choice with calls: ``tool_calls``, unless ``max_tokens`` cut it
    (``length`` says the calls given are those made whole before the cut)."""
    return "length" if reason == "length" else "tool_calls"


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_calls_body(calls: list[Call]) -> list[dict[str, Any]]:
    """The message's ``tool_calls``."""
    return [
        {"id": new_call_id(), "type": "function",
         "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]  # fmt: skip


def _head(index: int, name: str) -> list[dict[str, Any]]:
    """The ``delta.tool_calls`` that opens a streamed call: its id, type and name."""
    return [{"index": index, "id": new_call_id(), "type": "function",
             "function": {"name": name, "arguments": ""}}]  # fmt: skip


def _fragment(index: int, arguments: str) -> list[dict[str, Any]]:
    return [{"index": index, "function": {"arguments": arguments}}]


def call_deltas(calls: list[Call], first_index: int = 0) -> list[list[dict[str, Any]]]:
    """The ``delta.tool_calls`` of the chunks that stream whole ``calls``: per call its head
    (arguments empty), then its arguments, as OpenAI streams them."""
    deltas = []
    for index, call in enumerate(calls, first_index):
        deltas += [_head(index, call.name), _fragment(index, call.arguments)]
    return deltas


class ToolStream:
    """One streamed choice of a request with tools. ``auto``: content is sent as it comes,
    except what may be a call (from a ``<tool_call>`` tag, or an output that opens with ``{``
    or ``[``), held until the choice ends and then sent as calls, or as content if it is none.
    Constrained (``required``, named): each call is sent as it is written, its head once its
    name is known, then its arguments' text as it grows (trailing whitespace held back)."""

    def __init__(self, mode: ToolMode) -> None:
        self.mode, self.text, self.sent = mode, "", 0
        self.scanner = CallScanner() if mode.kind == "required" else None
        self.args_sent: list[int] = []  # per call under way: the arguments' characters sent

    def feed(self, piece: str) -> tuple[str, list[list[dict[str, Any]]]]:
        """The content, and the ``delta.tool_calls``, that may go out now."""
        self.text += piece
        if self.mode.kind != "auto":
            if self.scanner is not None:
                self.scanner.feed(piece)
            return "", self._call_deltas()
        end = self._safe_end()
        out, self.sent = self.text[self.sent : end], max(self.sent, end)
        return out, []

    def _safe_end(self) -> int:
        text = self.text
        if not text.strip() or (self.sent == 0 and text.lstrip()[0] in "{["):
            return 0
        at = text.find(TOOL_CALL_OPEN)
        if at >= 0:
            return at
        for k in range(min(len(TOOL_CALL_OPEN) - 1, len(text)), 0, -1):
            if text.endswith(TOOL_CALL_OPEN[:k]):  # the tag may be arriving
                return len(text) - k
        return len(text)

    def _written(self) -> list[tuple[str, str]]:
        """A constrained output's calls so far, each its name and its arguments' text (what
        ``ToolMode.parse`` answers once they are whole, so the stream adds up to it)."""
        if self.scanner is None:  # named: the whole output is the arguments
            arguments = self.text.strip()
            return [(self.mode.names[0], arguments)] if arguments else []
        written = []
        for call in self.scanner.calls:
            if call.name is None:
                break
            written.append((call.name, self.scanner.arguments(call)))
        return written

    def _call_deltas(self) -> list[list[dict[str, Any]]]:
        deltas = []
        for index, (name, arguments) in enumerate(self._written()):
            if index == len(self.args_sent):
                self.args_sent.append(0)
                deltas.append(_head(index, name))
            if len(arguments) > self.args_sent[index]:
                deltas.append(_fragment(index, arguments[self.args_sent[index] :]))
                self.args_sent[index] = len(arguments)
        return deltas

    def finish(self) -> tuple[str, list[list[dict[str, Any]]], bool]:
        """Once the choice has ended: the content not sent yet, the last ``delta.tool_calls``,
        and whether the choice made calls."""
        if self.mode.kind != "auto":
            if self.args_sent:
                return "", self._call_deltas(), True
            return self.mode.parse(self.text)[0], [], False
        content, calls = self.mode.parse(self.text)
        rest = content[self.sent :]
        return (rest if rest.strip() or not calls else ""), call_deltas(calls), bool(calls)
