"""Tools and tool messages into the prompt (``worker.engine.chat_tools``): through a template
that knows tools, and through the generic template for one that does not (the tiny model's,
SmolLM2's, renders ``role`` and ``content`` only)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from gateway.tool_calls import ToolMode
from producer.messages import ChatMessage, ToolSpec
from worker.engine.chat_tools import template_knows_tools, template_shows_names
from worker.engine.prompt import InvalidRequestError, encode_prompt

WEATHER = ToolSpec.model_validate(
    {"function": {"name": "get_weather", "description": "Weather in a city",
                  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
)  # fmt: skip
TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "tool_calls": [
        {"id": "c1", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"},
]  # fmt: skip
# A minimal tool-aware template: the tools as JSON, and a call's arguments read as data.
TOOL_TEMPLATE = (
    "{% if tools %}TOOLS {{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}"
    "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }}({{ c.function.arguments.city }})"
    "{% endfor %}{% if m.tool_call_id %} for {{ m.tool_call_id }}{% endif %}\n{% endfor %}"
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def text_of(tokenizer: Any, messages: list[dict[str, Any]], tools: Any = None) -> str:
    return str(tokenizer.decode(encode_prompt(tokenizer, messages, tools=tools)))


def test_generic_template_puts_tools_and_calls_in_text(tokenizer: Any) -> None:
    assert not template_knows_tools(tokenizer)
    text = text_of(tokenizer, TURNS, [WEATHER])
    assert text.startswith("<|im_start|>system\nYou can call functions")
    assert '"name": "get_weather"' in text and "<tools>" in text
    # The past call in the format the gateway reads back, and the answer as a user turn.
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert f"<|im_start|>assistant\n{call}<|im_end|>" in text
    assert "<|im_start|>user\n<tool_response>\nsunny, 21 C\n</tool_response>" in text
    assert ToolMode("auto", ("get_weather",)).parse(call)[1][0].name == "get_weather"
    # A system message of the caller's keeps its text, the tools after it.
    system = text_of(tokenizer, [{"role": "system", "content": "Be brief."}, *TURNS], [WEATHER])
    assert system.startswith("<|im_start|>system\nBe brief.\n\nYou can call functions")


def test_without_tools_the_prompt_is_unchanged(tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "hi"}]
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text_of(tokenizer, messages) == expected


def test_a_template_that_knows_tools_renders_them(tokenizer: Any) -> None:
    aware = copy.deepcopy(tokenizer)
    aware.chat_template = TOOL_TEMPLATE
    assert template_knows_tools(aware)
    text = text_of(aware, TURNS, [WEATHER])
    assert text.startswith('TOOLS [{"type": "function", "function": {"name": "get_weather"')
    assert "[assistant]CALL get_weather(Paris)" in text  # arguments handed over as a dict
    assert "[tool]sunny, 21 C for c1" in text
    assert "<tool_call>" not in text
    # A function without parameters still has an (empty) object schema, and no nulls.
    bare = ToolSpec.model_validate({"function": {"name": "get_time"}})
    text = text_of(aware, TURNS[:1], [bare])
    assert '"parameters": {"type": "object", "properties": {}' in text and "null" not in text


def test_tools_need_messages(tokenizer: Any) -> None:
    with pytest.raises(InvalidRequestError, match="tools are rendered with chat messages"):
        encode_prompt(tokenizer, "a plain prompt", tools=[WEATHER])
    with pytest.raises(InvalidRequestError, match="invalid chat message"):
        encode_prompt(tokenizer, [{"role": "robot", "content": "x"}])
    assert ChatMessage(role="assistant").content == ""


def test_names_are_shown_by_the_template_or_as_a_prefix(tokenizer: Any) -> None:
    named = [{"role": "system", "content": "Be brief.", "name": "ops"},
             {"role": "user", "content": "Weather?", "name": "ada"}]  # fmt: skip
    assert not template_shows_names(tokenizer)  # SmolLM2's renders role and content only
    text = text_of(tokenizer, named)
    assert "<|im_start|>system\nops: Be brief.<|im_end|>" in text
    assert "<|im_start|>user\nada: Weather?<|im_end|>" in text
    with_tools = text_of(tokenizer, named, [WEATHER])  # the generic template keeps it too
    assert with_tools.startswith("<|im_start|>system\nops: Be brief.\n\nYou can call")
    shows = copy.deepcopy(tokenizer)
    shows.chat_template = (
        "{% for m in messages %}[{{ m.role }}{% if m.name %} {{ m.name }}{% endif %}]"
        "{{ m.content }}\n{% endfor %}"
    )
    assert template_shows_names(shows)
    assert text_of(shows, named) == "[system ops]Be brief.\n[user ada]Weather?\n"
