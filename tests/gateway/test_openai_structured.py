"""OpenAI request bodies -> JobSpec: response_format, tools and tool_choice, logprobs, penalties.

Each body goes through the route's own conversion (``prompt_fields``, ``sampling``, then
``build_spec``, as ``openai_api.run_openai`` and a batch line do); no Redis, no worker.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from gateway.errors import ApiError
from gateway.openai_models import ChatCompletionRequest, CompletionRequest
from producer import InvalidJob, JobSpec
from producer.constraints import JsonObjectConstraint, JsonSchemaConstraint
from producer.requests import build_spec

USER = [{"role": "user", "content": "Weather in Paris?"}]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}
TIME = {"type": "function", "function": {"name": "get_time"}}  # no parameters: takes none


def spec_of(body: dict[str, Any], chat: bool = True) -> JobSpec:
    model = ChatCompletionRequest if chat else CompletionRequest
    request: ChatCompletionRequest | CompletionRequest = model.model_validate(body)
    fields = {**request.prompt_fields(), **request.sampling(request.token_limit, 256)}
    return build_spec(**fields)


def chat(**kw: Any) -> JobSpec:
    return spec_of({"messages": USER, **kw})


def test_response_format_json_object_and_json_schema() -> None:
    assert chat().sampling.structure is None
    assert chat(response_format={"type": "text"}).sampling.structure is None
    json_mode = chat(response_format={"type": "json_object"}).sampling.structure
    assert isinstance(json_mode, JsonObjectConstraint)
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY, "strict": True}}
    structure = chat(response_format=fmt).sampling.structure
    assert isinstance(structure, JsonSchemaConstraint)
    assert structure.schema_ == CITY and structure.strict
    loose = {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY}}
    assert chat(response_format=loose).sampling.structure.strict is False  # type: ignore[union-attr]
    # On completions too, as vLLM takes it.
    prompt = spec_of({"prompt": "{", "response_format": {"type": "json_object"}}, chat=False)
    assert isinstance(prompt.sampling.structure, JsonObjectConstraint)


def test_response_format_refusals() -> None:
    with pytest.raises(ApiError, match="json_schema: required"):
        chat(response_format={"type": "json_schema"})
    with pytest.raises(ValueError, match="response_format"):
        chat(response_format={"type": "yaml"})


def test_penalties_logit_bias_and_vllm_extras_reach_the_spec() -> None:
    sampling = chat(
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        repetition_penalty=1.2,
        logit_bias={"5": -100, "17": 3.5},
        top_k=4,
        min_p=0.1,
    ).sampling
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, -0.25)
    assert sampling.repetition_penalty == 1.2 and (sampling.top_k, sampling.min_p) == (4, 0.1)
    assert sampling.logit_bias == {5: -100.0, 17: 3.5}
    plain = chat(temperature=0.3, top_p=0.9, seed=4, stop="x", max_completion_tokens=7).sampling
    assert (plain.temperature, plain.top_p, plain.seed, plain.stop) == (0.3, 0.9, 4, ("x",))
    assert plain.max_tokens == 7 and chat().sampling.max_tokens == 256  # the route's default
    # The spec's ranges, named as the wire names them.
    with pytest.raises(InvalidJob, match=r"sampling\.presence_penalty"):
        chat(presence_penalty=3.0)
    with pytest.raises(InvalidJob, match=r"sampling\.logit_bias"):
        chat(logit_bias={"5": 101})
    with pytest.raises(InvalidJob, match=r"sampling\.logit_bias"):
        chat(logit_bias={"not-an-id": 1})


@pytest.mark.parametrize("name", ["guided_json", "guided_regex", "functions", "function_call"])
def test_known_but_unhonoured_parameters_are_refused_by_name(name: str) -> None:
    with pytest.raises(ApiError, match=name) as caught:
        chat(**{name: {"x": 1}})
    assert caught.value.status == 422 and caught.value.extra["param"] == name


def test_logprobs_chat_and_completions() -> None:
    assert chat().sampling.logprobs is None
    assert chat(logprobs=True).sampling.logprobs == 0  # the sampled token's only
    assert chat(logprobs=True, top_logprobs=3).sampling.logprobs == 3
    with pytest.raises(ApiError, match="top_logprobs needs logprobs"):
        chat(top_logprobs=3)
    assert spec_of({"prompt": "A", "logprobs": 2}, chat=False).sampling.logprobs == 2
    with pytest.raises(InvalidJob, match=r"sampling\.logprobs"):
        chat(logprobs=True, top_logprobs=21)


def test_tool_choice_auto_renders_the_tools_without_a_constraint() -> None:
    spec = chat(tools=[WEATHER, TIME])
    assert spec.tools is not None and [t.function.name for t in spec.tools] == [
        "get_weather",
        "get_time",
    ]
    assert spec.sampling.structure is None
    # none: the model is not told of the tools, and its text stays content
    assert chat(tools=[WEATHER], tool_choice="none").tools is None


def test_tool_choice_required_constrains_to_an_array_of_calls() -> None:
    structure = chat(tools=[WEATHER, TIME], tool_choice="required").sampling.structure
    assert isinstance(structure, JsonSchemaConstraint) and structure.strict
    schema = structure.schema_
    jsonschema.validate([{"name": "get_weather", "arguments": {"city": "Paris"}}], schema)
    jsonschema.validate([{"name": "get_time", "arguments": {}}, {"name": "get_time",
                         "arguments": {}}], schema)  # fmt: skip
    for bad in (
        [],
        [{"name": "get_weather", "arguments": {}}],  # city is required
        [{"name": "get_news", "arguments": {}}],
        {"name": "get_time", "arguments": {}},  # not in an array
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    one = chat(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    assert one.sampling.structure.schema_["maxItems"] == 1  # type: ignore[union-attr]


def test_named_tool_choice_constrains_to_its_arguments() -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    structure = chat(tools=[WEATHER, TIME], tool_choice=choice).sampling.structure
    assert isinstance(structure, JsonSchemaConstraint) and structure.schema_ == CITY
    no_params = {"type": "function", "function": {"name": "get_time"}}
    schema = chat(tools=[TIME], tool_choice=no_params).sampling.structure.schema_  # type: ignore[union-attr]
    jsonschema.validate({}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"x": 1}, schema)


def test_tool_refusals() -> None:
    with pytest.raises(ApiError, match="give tools"):
        chat(tool_choice="required")
    with pytest.raises(ApiError, match="no tool named 'nope'"):
        chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})
    fmt = {"type": "json_object"}
    with pytest.raises(ApiError, match="both constrain"):
        chat(tools=[WEATHER], tool_choice="required", response_format=fmt)
    with pytest.raises(InvalidJob, match="distinct"):
        chat(tools=[WEATHER, WEATHER])
    with pytest.raises(ValueError, match=r"tools\.0\.function\.name"):
        chat(tools=[{"type": "function", "function": {"name": "has space"}}])
    with pytest.raises(ValueError, match=r"tools\.0\.type"):
        chat(tools=[{"type": "web_search"}])


def test_tool_messages_of_the_next_turn_are_carried() -> None:
    call = {"id": "call_1", "type": "function", "refusal": None,  # an SDK's extra field
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    messages = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sun"}]},
    ]
    spec = spec_of({"messages": messages, "tools": [WEATHER]})
    assert spec.messages is not None
    assistant, tool = spec.messages[1], spec.messages[2]
    assert assistant.content == "" and assistant.tool_calls is not None
    assert assistant.tool_calls[0].function.arguments == '{"city": "Paris"}'
    assert (tool.role, tool.tool_call_id, tool.content) == ("tool", "call_1", "sun")
    with pytest.raises(InvalidJob, match="only a tool message carries tool_call_id"):
        spec_of({"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]})


def test_strict_tools_need_a_constrained_tool_choice() -> None:
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}  # type: ignore[dict-item]
    with pytest.raises(ApiError, match=r"tools\.0\.function\.strict: strict calls need"):
        chat(tools=[strict])
    structure = chat(tools=[strict], tool_choice="required").sampling.structure
    assert isinstance(structure, JsonSchemaConstraint)
