"""Tool calls out of a model's text (``gateway.tool_calls``), whole and streamed, and the
responses they make, checked against the ``openai`` SDK's own types."""

from __future__ import annotations

import json

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gateway.openai_chunks import ChunkWriter
from gateway.openai_logprobs import LogprobsByChoice
from gateway.openai_stream import Shape
from gateway.tool_calls import Call, ToolMode, ToolStream
from producer import JobResult
from producer.protocol import (
    ChoiceEnd,
    DoneEvent,
    Event,
    FinishReason,
    Timings,
    TokenEvent,
    TokenLogprob,
    TopLogprob,
    Usage,
)

AUTO = ToolMode("auto", ("get_weather", "get_time"))
PARIS = Call("get_weather", '{"city": "Paris"}')
OSLO = Call("get_weather", '{"city": "Oslo"}')
BLOCK = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (BLOCK, "", [PARIS]),
        (f"Let me look.\n{BLOCK}", "Let me look.\n", [PARIS]),
        (f"{BLOCK}\n{BLOCK.replace('Paris', 'Oslo')}", "\n", [PARIS, OSLO]),
        ('{"name": "get_weather", "arguments": {"city": "Paris"}}', "", [PARIS]),
        ('  [{"name": "get_time", "arguments": {}}]', "", [Call("get_time", "{}")]),
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),  # Llama 3.1
        ('<tool_call>{"name": "get_time"}', "", [Call("get_time", "{}")]),  # unclosed at the end
    ],
)
def test_auto_reads_calls(text: str, content: str, calls: list[Call]) -> None:
    assert AUTO.parse(text) == (content, calls)


@pytest.mark.parametrize(
    "text",
    [
        "It is sunny in Paris.",
        '{"city": "Paris"}',  # JSON, but no call
        '{"name": "get_news", "arguments": {}}',  # not one of our functions
        '{"name": "get_weather", "arguments": "Paris"}',  # arguments not an object
        '<tool_call>\n{"name": "get_weather", "arguments": {"ci',  # cut by max_tokens
        f'{BLOCK}<tool_call>{{"name": "get_news"}}</tool_call>',  # one block is no call
    ],
)
def test_auto_leaves_what_is_no_call_as_content(text: str) -> None:
    assert AUTO.parse(text) == (text, [])


def test_parallel_false_keeps_the_first_call() -> None:
    one = ToolMode("auto", ("get_weather",), parallel=False)
    assert one.parse(f"{BLOCK}{BLOCK}") == ("", [PARIS])


def test_constrained_modes() -> None:
    required = ToolMode("required", ("get_weather", "get_time"))
    calls = [{"name": "get_weather", "arguments": {"city": "Paris"}},
             {"name": "get_time", "arguments": {}}]  # fmt: skip
    assert required.parse(json.dumps(calls)) == ("", [PARIS, Call("get_time", "{}")])
    cut = '[{"name": "get_weather", "argu'
    assert required.parse(cut) == (cut, [])
    named = ToolMode("named", ("get_weather",))
    # The model's own text (whitespace around it dropped), as a stream sends it.
    assert named.parse(' {"city":  "Paris"}\n') == ("", [Call("get_weather", '{"city":  "Paris"}')])
    assert named.parse('{"city": "Pa') == ('{"city": "Pa', [])


def _feed(mode: ToolMode, text: str, step: int = 1) -> tuple[str, str, list[Call]]:
    stream = ToolStream(mode)
    sent = "".join(stream.feed(text[i : i + step])[0] for i in range(0, len(text), step))
    rest, deltas, called = stream.finish()
    calls = [Call(head[0]["function"]["name"], args[0]["function"]["arguments"])
             for head, args in zip(deltas[::2], deltas[1::2], strict=True)]  # fmt: skip
    assert called == bool(calls)
    return sent, rest, calls


@pytest.mark.parametrize("step", [1, 3, 7])
def test_stream_sends_content_and_holds_what_may_be_a_call(step: int) -> None:
    sent, rest, calls = _feed(AUTO, f"Let me look. {BLOCK}", step)
    assert sent == "Let me look. " and rest == "" and calls == [PARIS]
    sent, rest, calls = _feed(AUTO, "a < b, and <tool is no tag", step)
    assert sent + rest == "a < b, and <tool is no tag" and calls == []
    sent, rest, calls = _feed(AUTO, '\n{"name": "get_time", "arguments": {}}', step)
    assert (sent, rest, calls) == ("", "", [Call("get_time", "{}")])
    sent, rest, calls = _feed(AUTO, '{"not": "a call"}', step)
    assert (sent, rest, calls) == ("", '{"not": "a call"}', [])


def _token(text: str, index: int, choice: int = 0, token_id: int = 7) -> TokenEvent:
    lp = TokenLogprob(token_id=token_id, logprob=-0.5, rank=1,
                      top=(TopLogprob(token_id=token_id, logprob=-0.5),))  # fmt: skip
    return TokenEvent(choice=choice, index=index, text=text, token_ids=(token_id,), logprobs=(lp,))


def _done(*reasons: FinishReason) -> DoneEvent:
    usage = Usage(prompt_tokens=3, completion_tokens=5, total_tokens=8)
    ends = tuple(ChoiceEnd(choice=i, finish_reason=r, completion_tokens=1)
                 for i, r in enumerate(reasons))  # fmt: skip
    return DoneEvent(finish_reason=reasons[0], usage=usage, timings=Timings(queued_s=0,
                     total_s=1), choices=ends)  # fmt: skip


def test_streamed_tool_calls_reassemble_with_the_sdk() -> None:
    shape = Shape("job1", "m", True, tools=AUTO)
    text = f"Checking. {BLOCK}"
    pieces = [text[i : i + 5] for i in range(0, len(text), 5)]
    events: list[Event] = [_token(p, i) for i, p in enumerate(pieces)]
    events.append(_done(FinishReason.STOP))
    writer = ChunkWriter(shape)
    chunks = [ChatCompletionChunk.model_validate(c) for e in events for c in writer.chunks(e)]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert [d.tool_calls[0].function.name for d in deltas if d.tool_calls and  # type: ignore[union-attr]
            d.tool_calls[0].id] == ["get_weather"]  # fmt: skip
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(chunk)
    final = state.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls" and final.message.content == "Checking. "
    calls = final.message.tool_calls or []
    named = [(c.function.name, json.loads(c.function.arguments)) for c in calls]
    assert named == [("get_weather", {"city": "Paris"})]


def test_stream_without_tools_and_with_logprobs() -> None:
    shape = Shape("job1", "m", True, logprobs=True)
    writer = ChunkWriter(shape)
    events: list[Event] = [_token("Hi", 0, token_id=9), _token(" there", 1)]
    events.append(_done(FinishReason.LENGTH))
    chunks = [ChatCompletionChunk.model_validate(c) for e in events for c in writer.chunks(e)]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hi there"
    tokens = [t.token for c in chunks if c.choices[0].logprobs
              for t in c.choices[0].logprobs.content or ()]  # fmt: skip
    assert tokens == ["token_id:9", "token_id:7"]
    assert chunks[-1].choices[0].finish_reason == "length"


def test_whole_response_with_calls_logprobs_and_two_choices() -> None:
    shape = Shape("job1", "m", True, tools=AUTO, logprobs=True)
    result, logprobs = JobResult("job1"), LogprobsByChoice()
    events: list[Event] = [_token(BLOCK, 0), _token("Sunny.", 0, choice=1)]
    events += [_token("Sunny.", 0, choice=1), _done(FinishReason.STOP, FinishReason.STOP)]
    for event in events:
        result.apply(event)
        if isinstance(event, TokenEvent):
            logprobs.add(event)  # the repeated event counts once
    body = ChatCompletion.model_validate(shape.whole(result, logprobs))
    first, second = body.choices
    assert first.finish_reason == "tool_calls" and first.message.content is None
    assert first.message.tool_calls is not None and first.message.tool_calls[0].id.startswith(
        "call_"
    )
    assert (second.finish_reason, second.message.content) == ("stop", "Sunny.")
    assert second.logprobs is not None and len(second.logprobs.content or ()) == 1


def test_completion_logprobs_shape() -> None:
    shape = Shape("job1", "m", False, logprobs=True)
    result, logprobs = JobResult("job1"), LogprobsByChoice()
    for event in [_token("a", 0, token_id=3), _token("b", 1, token_id=4)]:
        result.apply(event)
        logprobs.add(event)
    result.apply(_done(FinishReason.LENGTH))
    choice = shape.whole(result, logprobs)["choices"][0]
    assert choice["text"] == "ab"
    assert choice["logprobs"]["tokens"] == ["token_id:3", "token_id:4"]
    assert choice["logprobs"]["token_logprobs"] == [-0.5, -0.5]
    assert choice["logprobs"]["top_logprobs"] == [{"token_id:3": -0.5}, {"token_id:4": -0.5}]


def test_required_cut_by_max_tokens_keeps_the_whole_calls() -> None:
    required = ToolMode("required", ("get_weather", "get_time"))
    cut = '[\n{"name": "get_time", "arguments": {}},\n {"name": "get_weather", "arguments": {"ci'
    assert required.parse(cut) == ("", [Call("get_time", "{}")])
    assert required.parse('[{"name": "get_news", "arguments": {}}, {"na') == (
        '[{"name": "get_news", "arguments": {}}, {"na',
        [],
    )
    shape = Shape("job1", "m", True, tools=required)
    result, events = JobResult("job1"), [_token(cut, 0), _done(FinishReason.LENGTH)]
    for event in events:
        result.apply(event)  # type: ignore[arg-type]
    choice = ChatCompletion.model_validate(shape.whole(result)).choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls is not None
    writer = ChunkWriter(shape)
    chunks = [c for e in events for c in writer.chunks(e)]  # type: ignore[arg-type]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    # Streamed, each call went out as it was written: the whole one, and the one under way.
    assert sum("tool_calls" in c["choices"][0].get("delta", {}) for c in chunks) == 4
