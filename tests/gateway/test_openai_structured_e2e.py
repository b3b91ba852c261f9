"""Structured outputs, tool calls and logprobs end to end: the official ``openai`` client, the
gateway, Redis and a worker on the tiny random model.

The tiny model's weights are random, so whatever it writes under a constraint is the
constraint's doing: every output must parse and validate, at temperature 0.7 and any seed.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from pydantic import BaseModel, Field

from tests.gateway.conftest import Served

pytestmark = pytest.mark.slow
MODEL = "paternoster"
SEEDS = range(3)
ASK = [{"role": "user", "content": "Describe the weather."}]
WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "sky": {"enum": ["sunny", "cloudy", "rain"]},
        "windy": {"type": "boolean"},
        "celsius": {"type": "integer", "minimum": -30, "maximum": 45},
        "hours": {
            "type": "array",
            "items": {"enum": [6, 12, 18]},
            "minItems": 1,
            "maxItems": 3,
        },
    },
    "required": ["sky", "windy", "celsius", "hours"],
    "additionalProperties": False,
}
CITY_PARAMS = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}, "metric": {"type": "boolean"}},
    "required": ["city", "metric"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": CITY_PARAMS}},
    {"type": "function", "function": {"name": "get_time", "description": "the time now"}},
]
PARAMS = {"get_weather": CITY_PARAMS, "get_time": {"type": "object", "maxProperties": 0}}


class Forecast(BaseModel):
    sky: Literal["sunny", "cloudy", "rain"]
    windy: bool
    celsius: int = Field(ge=-30, le=45)


@pytest.fixture
def client(gateway: Served) -> openai.OpenAI:
    return openai.OpenAI(api_key="unused", base_url=f"{gateway.url}/v1", max_retries=0)


def chat(client: openai.OpenAI, **kw: Any) -> Any:
    """``chat.completions.create`` with this file's messages unless given (typed loosely:
    the SDK's overloads want its TypedDicts, the tests write plain dicts)."""
    create: Any = client.chat.completions.create
    return create(model=MODEL, **{"messages": ASK, **kw})


def test_response_format_json_schema_parses_and_validates(client: openai.OpenAI) -> None:
    schema = {"name": "weather", "schema": WEATHER_SCHEMA, "strict": True}
    fmt = {"type": "json_schema", "json_schema": schema}
    for seed in SEEDS:
        out = chat(client, response_format=fmt, temperature=0.7, seed=seed, max_tokens=120)
        assert out.choices[0].finish_reason == "stop", out.choices[0].message.content
        jsonschema.validate(json.loads(out.choices[0].message.content or ""), WEATHER_SCHEMA)


def test_json_object_mode(client: openai.OpenAI) -> None:
    out = chat(client, response_format={"type": "json_object"}, max_tokens=40)
    text = out.choices[0].message.content or ""
    if out.choices[0].finish_reason == "stop":  # any object: it may not close in 40 tokens
        assert isinstance(json.loads(text), dict)
    assert text.lstrip().startswith("{")


def test_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    parse: Any = client.chat.completions.parse
    for seed in SEEDS:
        out = parse(model=MODEL, messages=ASK, response_format=Forecast, temperature=0.7,
                    seed=seed, max_tokens=80)  # fmt: skip
        parsed = out.choices[0].message.parsed
        assert isinstance(parsed, Forecast), out.choices[0].message.content


def _check_calls(calls: Any) -> None:
    assert calls
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def test_tool_choice_required_always_yields_a_parseable_call(client: openai.OpenAI) -> None:
    for seed in SEEDS:
        out = chat(client, tools=TOOLS, tool_choice="required", temperature=0.7, seed=seed,
                   max_tokens=120)  # fmt: skip
        choice = out.choices[0]
        # `length`: the model went on calling until max_tokens (a random model may: the
        # grammar allows parallel calls); the calls made whole before the cut are returned.
        assert choice.finish_reason in ("tool_calls", "length"), choice.message.content
        assert choice.message.tool_calls, (choice.finish_reason, choice.message.content)
        _check_calls(choice.message.tool_calls)


def test_named_tool_streamed_as_tool_call_chunks(client: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    stream = chat(client, tools=TOOLS, tool_choice=named, max_tokens=60, stream=True)
    state = ChatCompletionStreamState()
    for chunk in stream:
        state.handle_chunk(chunk)
    final = state.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    calls = final.message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_weather"]
    _check_calls(calls)


def _stream_final(stream: Any) -> tuple[Any, int]:
    """The accumulated choice of a stream (the SDK's snapshot: its final completion raises on
    ``length``), and how many chunks carried argument fragments."""
    state, fragments = ChatCompletionStreamState(), 0
    for chunk in stream:
        state.handle_chunk(chunk)
        calls = chunk.choices[0].delta.tool_calls if chunk.choices else None
        fragments += sum(bool(c.function and c.function.arguments) for c in calls or ())
    return state.current_completion_snapshot.choices[0], fragments


@pytest.mark.parametrize("tool_choice", ["required", "named"])
def test_streamed_calls_add_up_to_the_unstreamed_ones(
    client: openai.OpenAI, tool_choice: str
) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    kw = {"tools": TOOLS, "tool_choice": named if tool_choice == "named" else "required",
          "temperature": 0, "seed": 1, "max_tokens": 120}  # fmt: skip
    whole = chat(client, **kw).choices[0]
    streamed, fragments = _stream_final(chat(client, stream=True, **kw))
    assert streamed.finish_reason == whole.finish_reason
    expected = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    got = [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls]
    # Cut by max_tokens, the stream also sent the call under way (the whole answer drops it).
    assert got == expected if whole.finish_reason == "tool_calls" else got[: len(expected)]
    assert fragments > len(got)  # the arguments came in pieces, as they were written
    _check_calls(whole.message.tool_calls)


def test_names_and_refused_message_fields(client: openai.OpenAI) -> None:
    named = [{"role": "user", "content": "Describe the weather.", "name": "ada"}]
    anonymous = chat(client, max_tokens=1).usage.prompt_tokens
    assert chat(client, messages=named, max_tokens=1).usage.prompt_tokens > anonymous
    answer = {"role": "assistant", "content": "Sunny.", "audio": {"id": "audio_1"}}
    with pytest.raises(openai.UnprocessableEntityError, match=r"messages\.1\.audio"):
        chat(client, messages=[*ASK, answer], max_tokens=1)


def test_the_next_turn_takes_tool_messages(client: openai.OpenAI) -> None:
    first = chat(client, tools=TOOLS, tool_choice="required", max_tokens=120)
    message = first.choices[0].message
    answers = [{"role": "tool", "tool_call_id": c.id, "content": "sunny"}
               for c in message.tool_calls]  # fmt: skip
    messages = [*ASK, message.model_dump(exclude_none=True), *answers]
    second = chat(client, messages=messages, tools=TOOLS, max_tokens=8, presence_penalty=0.5,
                  frequency_penalty=0.5)  # fmt: skip
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_logprobs_chat_and_completions(client: openai.OpenAI) -> None:
    whole = chat(client, max_tokens=5, logprobs=True, top_logprobs=2)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 for t in content)
    assert "".join(t.token for t in content) == whole.choices[0].message.content  # own texts
    assert all(t.bytes == list(t.token.encode()) for t in content)
    assert all(t.logprob <= 0 for t in content)
    chunks = list(chat(client, max_tokens=5, logprobs=True, stream=True,
                       stream_options={"include_usage": True}))  # fmt: skip
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content or ()]  # fmt: skip
    assert len(streamed) == chunks[-1].usage.completion_tokens
    assert all(t.top_logprobs == [] for t in streamed)  # logprobs alone: no alternatives
    text = client.completions.create(model=MODEL, prompt="The sky", max_tokens=4, logprobs=1)
    logprobs = text.choices[0].logprobs
    assert logprobs is not None and text.usage is not None
    assert len(logprobs.tokens or ()) == text.usage.completion_tokens
    tokens = logprobs.tokens or []
    assert logprobs.text_offset == [len("".join(tokens[:i])) for i in range(len(tokens))]
    assert all(len(top) == 1 for top in logprobs.top_logprobs or ())


def test_a_schema_that_does_not_compile_is_the_callers_error(client: openai.OpenAI) -> None:
    # Valid JSON Schema, but a pattern no grammar backend takes (lookbehind): the worker's
    # compile fails, the job ends invalid_request, a 400 naming the problem; the worker goes on.
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)a"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "bad", "schema": schema}}
    with pytest.raises(openai.BadRequestError, match="invalid_request"):
        chat(client, response_format=fmt, max_tokens=8)
    assert chat(client, max_tokens=2).choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="logit_bias"):  # an id past the vocabulary
        chat(client, logit_bias={"99999999": 5}, max_tokens=2)


def test_native_api_takes_the_structure_keywords_and_tools(gateway: Served) -> None:
    with gateway.client() as http:
        for body, allowed in (
            ({"messages": ASK, "choice": ["yes", "no"]}, {"yes", "no"}),
            ({"prompt": "Code:", "regex": "[0-9]{3}"}, None),
            ({"messages": ASK, "tools": TOOLS, "json_schema": CITY_PARAMS}, None),
        ):
            created = http.post("/v1/jobs", json={**body, "max_tokens": 40, "temperature": 0.7})
            assert created.status_code == 201, created.text
            job_id = created.json()["job_id"]
            text = http.get(f"/v1/jobs/{job_id}/result", params={"timeout_s": 30}).json()["text"]
            if allowed is not None:
                assert text in allowed
            elif "regex" in body:
                assert len(text) == 3 and text.isdigit()
            else:
                jsonschema.validate(json.loads(text), CITY_PARAMS)
        refused = http.post("/v1/jobs", json={"prompt": "x", "regex": "a", "choice": ["a"]})
        assert refused.status_code == 422 and "give one of regex, choice" in refused.text
