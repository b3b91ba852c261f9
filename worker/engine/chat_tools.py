"""Chat messages and function tools into a chat template's arguments (``prompt.encode_prompt``).

A template that knows tools (it names ``tools``, as Qwen's, Llama 3.1's, Hermes's and Mistral's
do) gets them as ``apply_chat_template(..., tools=...)``, and past calls as its ``tool_calls``
with the arguments as data, as Hugging Face's templates expect. A template that does not (the
bundled SmolLM2's) would drop them silently, so the generic template takes over: the tools go
into the system message as JSON with the calling convention (``producer.messages``, Hermes's
``<tool_call>`` format), a past call becomes the assistant's text in that format, and a tool's
answer a user message between ``<tool_response>`` tags, which every template can render.

A message's ``name`` (OpenAI's participant name) goes to a template that shows it as the
message's ``name``, as Hugging Face templates read it; one that would drop it (SmolLM2's, most
others) gets it as a ``"<name>: "`` prefix of the content instead, so it is never lost.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from producer.messages import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    ChatMessage,
    ToolSpec,
    arguments_value,
    tool_call_text,
)

# The generic template's instructions, ahead of the tools' JSON (one function a line).
GENERIC_TOOLS_HEADER = (
    "You can call functions to help answer. Each function is described by a JSON object "
    "on its own line between <tools> and </tools>:"
)
GENERIC_TOOLS_FOOTER = (
    "To call a function, answer with one block per call, holding a JSON object with the "
    f"function's name and its arguments:\n{TOOL_CALL_OPEN}\n"
    '{"name": "<function name>", "arguments": {<arguments as a JSON object>}}\n'
    f"{TOOL_CALL_CLOSE}\nA function's result comes back between {TOOL_RESPONSE_OPEN} and "
    f"{TOOL_RESPONSE_CLOSE}."
)


def template_knows_tools(tokenizer: Any) -> bool:
    """Whether the model's chat template renders ``tools`` (a template that never names them
    would ignore the argument)."""
    template = getattr(tokenizer, "chat_template", None)
    templates = template.values() if isinstance(template, Mapping) else [template]
    return any(isinstance(t, str) and "tools" in t for t in templates)


# Whether a chat template shows a message's name, by template text: one probe render each.
_SHOWS_NAMES: dict[str, bool] = {}
_PROBE_NAME = "paternoster_probe_name"


def template_shows_names(tokenizer: Any) -> bool:
    """Whether the chat template renders a message's ``name`` (tried on a probe message: a
    template may name ``name`` for tools' names only)."""
    key = repr(getattr(tokenizer, "chat_template", None))
    if key not in _SHOWS_NAMES:
        probe = [{"role": "user", "content": "x", "name": _PROBE_NAME}]
        try:
            text = tokenizer.apply_chat_template(probe, tokenize=False)
        except Exception:  # a template that refuses a lone user message (jinja2's errors, its own)
            text = ""
        _SHOWS_NAMES[key] = isinstance(text, str) and _PROBE_NAME in text
    return _SHOWS_NAMES[key]


def _named(out: dict[str, Any], message: ChatMessage, shows_names: bool) -> dict[str, Any]:
    """``out`` with the message's name: as the template's ``name``, or a prefix it shows."""
    if message.name is not None:
        if shows_names:
            out["name"] = message.name
        else:
            out["content"] = f"{message.name}: {out['content']}"
    return out


def native_message(message: ChatMessage, shows_names: bool = False) -> dict[str, Any]:
    """A message as a tool-aware Hugging Face template reads it."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls is not None:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.function.name,
                    "arguments": arguments_value(call.function.arguments),
                },
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return _named(out, message, shows_names)


def native_tool(tool: ToolSpec) -> dict[str, Any]:
    """A tool as templates read it: no nulls, and always ``parameters`` (templates such as
    Llama 3.1's read its ``properties`` unguarded)."""
    out = tool.model_dump(mode="json", exclude_none=True)
    out["function"]["parameters"] = tool.function.arguments_schema()
    return out


def generic_message(message: ChatMessage, shows_names: bool = False) -> dict[str, Any]:
    """A message in the generic template: plain role and text (and its name), whatever it
    carried."""
    if message.role == "tool":
        text = f"{TOOL_RESPONSE_OPEN}\n{message.content}\n{TOOL_RESPONSE_CLOSE}"
        return {"role": "user", "content": text}
    calls = [tool_call_text(call.function) for call in message.tool_calls or ()]
    content = "\n".join(([message.content] if message.content else []) + calls)
    return _named({"role": message.role, "content": content}, message, shows_names)


def generic_tools_text(tools: Sequence[ToolSpec]) -> str:
    lines = [json.dumps(t.model_dump(mode="json", exclude_none=True), ensure_ascii=False)
             for t in tools]  # fmt: skip
    return "\n".join([GENERIC_TOOLS_HEADER, "<tools>", *lines, "</tools>", GENERIC_TOOLS_FOOTER])


def template_arguments(
    tokenizer: Any, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The ``conversation`` and ``tools`` to give ``apply_chat_template``."""
    shows_names = any(m.name is not None for m in messages) and template_shows_names(tokenizer)
    if template_knows_tools(tokenizer):
        native_tools = None if not tools else [native_tool(t) for t in tools]
        return [native_message(m, shows_names) for m in messages], native_tools
    rendered = [generic_message(m, shows_names) for m in messages]
    if tools:
        block = generic_tools_text(tools)
        if rendered and rendered[0]["role"] == "system":
            rendered[0] = {"role": "system", "content": f"{rendered[0]['content']}\n\n{block}"}
        else:
            rendered.insert(0, {"role": "system", "content": block})
    return rendered, None
