"""Chat messages and function tools as a job carries them (``JobSpec.messages``, ``.tools``).

The shapes are OpenAI's, so the gateway passes a chat request's messages and tools through as
they came: an assistant message may carry ``tool_calls`` (each call's ``arguments`` the JSON
text the model wrote), and the ``tool`` message answering one names it by ``tool_call_id``. How
a worker renders them into a prompt is ``worker.engine.prompt``'s (docs/gateway.md#tool-calls).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from producer.wire import Frozen, WireBool

# OpenAI's rule for a function's name: what a model is asked to write back, so nothing a JSON
# string or a chat template would have to escape.
FUNCTION_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
FunctionName = Annotated[str, Field(pattern=FUNCTION_NAME_PATTERN)]


class FunctionCall(Frozen):
    name: FunctionName
    arguments: str  # JSON text, as the model wrote it (OpenAI's wire form)


class ToolCall(Frozen):
    """One call an assistant message made; ``id`` is what the answering tool message names."""

    id: str = Field(min_length=1, max_length=128)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Frozen):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""  # an assistant message that only calls tools has none
    tool_calls: tuple[ToolCall, ...] | None = None  # assistant messages only
    tool_call_id: str | None = Field(default=None, min_length=1, max_length=128)  # tool only
    # OpenAI's participant name (not on tool messages), under a function name's rule: nothing
    # a template would have to escape. Rendered as ``worker.engine.chat_tools`` says.
    name: FunctionName | None = None

    @model_validator(mode="after")
    def _tool_fields_by_role(self) -> ChatMessage:
        if self.name is not None and self.role == "tool":
            raise ValueError("a tool message carries no name (its tool_call_id names the call)")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only an assistant message carries tool_calls")
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError("only a tool message carries tool_call_id")
        return self


class FunctionSpec(Frozen):
    """A function the model may call: ``parameters`` is the JSON Schema of its arguments
    (an object schema; None: it takes none)."""

    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    # OpenAI's: calls follow ``parameters`` exactly. The gateway keeps it by constraining the
    # output (tool_choice required or named) and refuses it where it cannot (auto).
    strict: WireBool | None = None

    def arguments_schema(self) -> dict[str, Any]:
        """The schema a call's ``arguments`` follow: ``parameters``, else an empty object."""
        if self.parameters is None:
            return {"type": "object", "properties": {}, "additionalProperties": False}
        return self.parameters


class ToolSpec(Frozen):
    type: Literal["function"] = "function"
    function: FunctionSpec


def _distinct_names(tools: tuple[ToolSpec, ...]) -> tuple[ToolSpec, ...]:
    names = [t.function.name for t in tools]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"function names must be distinct: {', '.join(twice)} given twice")
    if not tools:
        raise ValueError("give at least one tool, or none at all")
    return tools


# ``JobSpec.tools``: a call names its function, so two functions may not share a name.
Tools = Annotated[tuple[ToolSpec, ...], AfterValidator(_distinct_names)]


def function_names(tools: Sequence[ToolSpec]) -> list[str]:
    return [t.function.name for t in tools]


# The generic tool-call format (docs/gateway.md#tool-calls): what a worker asks a model whose
# chat template knows no tools to write, and how it renders a past call back into the prompt.
# It is Hermes's and Qwen's, so models trained on those write it unprompted.
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"


def arguments_value(arguments: str) -> Any:
    """A call's arguments as JSON data (a template renders a dict), or the text as given when
    it is not JSON (a model's malformed call, sent back as it was)."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def tool_call_text(call: FunctionCall) -> str:
    """One call in the generic format: its JSON object ``{name, arguments}`` between the tags."""
    body = {"name": call.name, "arguments": arguments_value(call.arguments)}
    return f"{TOOL_CALL_OPEN}\n{json.dumps(body, ensure_ascii=False)}\n{TOOL_CALL_CLOSE}"
