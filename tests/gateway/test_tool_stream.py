"""Constrained tool calls (``tool_choice`` required or a named function) streamed as they are
written (``gateway.call_scanner``, ``tool_calls.ToolStream``): a call's head as soon as its name
is known, its arguments in fragments, adding up to the unstreamed response's calls."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gateway.call_scanner import CallScanner
from gateway.openai_chunks import ChunkWriter
from gateway.openai_stream import Shape
from gateway.tool_calls import Call, ToolMode
from producer import JobResult
from producer.protocol import ChoiceEnd, DoneEvent, Event, FinishReason, Timings, TokenEvent, Usage

REQUIRED = ToolMode("required", ("get_weather", "get_time"))
NAMED = ToolMode("named", ("get_weather",))
# As the grammar writes it (compact, one line), with an escaped quote and brackets in a string.
CALLS = ('[{"name": "get_weather", "arguments": {"city": "Pa\\"ris]}", "days": [1, 2]}}, '
         '{"name": "get_time", "arguments": {}}]')  # fmt: skip


def _events(text: str, step: int, reason: FinishReason) -> list[Event]:
    events: list[Event] = [
        TokenEvent(choice=0, index=i, text=text[at : at + step], token_ids=(7,))
        for i, at in enumerate(range(0, len(text), step))
    ]
    usage = Usage(prompt_tokens=3, completion_tokens=len(events), total_tokens=3 + len(events))
    end = ChoiceEnd(choice=0, finish_reason=reason, completion_tokens=len(events))
    timings = Timings(queued_s=0, total_s=1)
    events.append(DoneEvent(finish_reason=reason, usage=usage, timings=timings, choices=(end,)))
    return events


def _stream(mode: ToolMode, text: str, step: int, reason: FinishReason) -> list[dict[str, Any]]:
    writer = ChunkWriter(Shape("job1", "m", True, tools=mode))
    return [chunk for event in _events(text, step, reason) for chunk in writer.chunks(event)]


def _whole(mode: ToolMode, text: str, reason: FinishReason) -> ChatCompletion:
    result = JobResult("job1")
    for event in _events(text, len(text), reason):
        result.apply(event)
    return ChatCompletion.model_validate(Shape("job1", "m", True, tools=mode).whole(result))


def _calls_of(chunks: list[dict[str, Any]]) -> tuple[Any, list[tuple[str, str]]]:
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    final = state.current_completion_snapshot.choices[0]  # the final one raises on length
    calls = [(c.function.name, c.function.arguments) for c in final.message.tool_calls or []]
    return final.finish_reason, calls


def _arguments_chunks(chunks: list[dict[str, Any]], index: int) -> list[str]:
    return [d["function"]["arguments"] for c in chunks
            for d in c["choices"][0].get("delta", {}).get("tool_calls", ())
            if d["index"] == index and d["function"]["arguments"]]  # fmt: skip


def test_scanner_finds_the_calls_and_their_arguments_text() -> None:
    scanner = CallScanner()
    for ch in CALLS:
        scanner.feed(ch)
    assert [(c.name, scanner.arguments(c), c.closed) for c in scanner.calls] == [
        ("get_weather", '{"city": "Pa\\"ris]}", "days": [1, 2]}', True),
        ("get_time", "{}", True),
    ]
    cut = CallScanner()
    cut.feed(CALLS[: CALLS.index("days") + 3])
    assert [(c.name, cut.arguments(c), c.closed) for c in cut.calls] == [
        ("get_weather", '{"city": "Pa\\"ris]}", "day', False)
    ]
    other = CallScanner()
    other.feed('{"name": "get_time", "arguments": {}}')  # no array: no calls
    assert other.calls == []


@pytest.mark.parametrize("step", [1, 4, 9])
def test_required_streams_each_call_as_it_is_written(step: int) -> None:
    chunks = _stream(REQUIRED, CALLS, step, FinishReason.STOP)
    deltas = [c["choices"][0]["delta"].get("tool_calls") for c in chunks[:-1]]
    heads = [i for i, d in enumerate(deltas) if d and "id" in d[0]]
    assert len(heads) == 2 and heads[0] < len(chunks) // 2  # the first call's head came early
    if step == 1:
        assert len(_arguments_chunks(chunks, 0)) > 20  # in fragments, not in one piece
    whole = _whole(REQUIRED, CALLS, FinishReason.STOP).choices[0]
    expected = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]  # type: ignore[union-attr]
    assert _calls_of(chunks) == ("tool_calls", expected)
    assert expected[0][1] == '{"city": "Pa\\"ris]}", "days": [1, 2]}'  # the model's own text
    assert json.loads(expected[0][1])["city"] == 'Pa"ris]}'


@pytest.mark.parametrize("step", [1, 5])
def test_named_streams_the_arguments_as_written(step: int) -> None:
    text = '{"city": "Oslo ", "days": [3]}  '  # trailing whitespace is no part of the call
    chunks = _stream(NAMED, text, step, FinishReason.STOP)
    first = chunks[0]["choices"][0]["delta"]["tool_calls"][0]
    assert first["function"] == {"name": "get_weather", "arguments": ""} and "id" in first
    whole = _whole(NAMED, text, FinishReason.STOP).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.tool_calls is not None
    assert _calls_of(chunks) == ("tool_calls", [("get_weather", text.strip())])
    assert whole.message.tool_calls[0].function.arguments == text.strip()  # type: ignore[union-attr]


def test_a_cut_stream_has_sent_the_call_under_way() -> None:
    cut = CALLS[: CALLS.index("days") + 3]
    whole = _whole(REQUIRED, cut, FinishReason.LENGTH).choices[0]
    assert whole.finish_reason == "length" and whole.message.tool_calls is None
    assert whole.message.content == cut  # no call closed: the text is content
    chunks = _stream(REQUIRED, cut, 3, FinishReason.LENGTH)
    assert _calls_of(chunks) == ("length", [("get_weather", '{"city": "Pa\\"ris]}", "day')])
    cut_named = _stream(NAMED, '{"city": "Pa', 2, FinishReason.LENGTH)
    assert _calls_of(cut_named) == ("length", [("get_weather", '{"city": "Pa')])
    assert _whole(NAMED, '{"city": "Pa', FinishReason.LENGTH).choices[0].message.content


def test_required_whole_calls_before_a_cut_are_given_unstreamed() -> None:
    cut = CALLS[: CALLS.index("get_time") + 12]
    whole = _whole(REQUIRED, cut, FinishReason.LENGTH).choices[0]
    names = [c.function.name for c in whole.message.tool_calls or []]  # type: ignore[union-attr]
    assert whole.finish_reason == "length" and names == ["get_weather"]
    parsed = ToolMode("required", ("get_time",)).parse(CALLS)  # a function not offered
    assert parsed == (CALLS, [])
    assert REQUIRED.parse(CALLS)[1][1] == Call("get_time", "{}")
