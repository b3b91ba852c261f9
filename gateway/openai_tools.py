"""``response_format``, ``tools`` and ``tool_choice`` of a chat request, as job fields.

- ``response_format``: ``json_object`` is the ``json_object`` constraint; ``json_schema`` the
  ``json_schema`` constraint on its schema (``strict`` as given; a format without a schema is
  any JSON object).
- ``tool_choice``: ``none`` sends no tools (the model is not told of them, and its text is
  content); ``auto`` (the default with tools) renders them and reads calls out of the text
  (``tool_calls``); ``required`` also constrains the output to a JSON array of calls to the
  given functions, each ``{"name", "arguments"}`` with the arguments following the function's
  ``parameters`` (one call when ``parallel_tool_calls`` is false); a named function constrains
  it to that function's arguments. Either way the call parses.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import ApiError
from gateway.tool_calls import ToolMode
from producer.messages import FunctionCall, ToolCall, ToolSpec, function_names
from producer.protocol import WireBool


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: WireBool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def structure(self) -> dict[str, Any] | None:
        """``SamplingSpec.structure`` for this format (None: free text)."""
        if self.type == "text":
            return None
        if self.type == "json_schema" and self.json_schema is None:
            raise ApiError(422, "response_format.json_schema: required for type json_schema",
                           param="response_format")  # fmt: skip
        if self.json_schema is None or self.json_schema.schema_ is None:
            return {"type": "json_object"}
        strict = bool(self.json_schema.strict)
        return {"type": "json_schema", "schema": self.json_schema.schema_, "strict": strict}


def refused_fields(model: BaseModel, echoes: tuple[str, ...] = ()) -> list[str]:
    """The fields of ``model`` given a value it does not declare: refused by name (a null is
    a field left out). ``echoes``: fields an SDK sends back beside ours, copies of them."""
    extra = model.model_extra or {}
    return [k for k, v in extra.items() if v is not None and k not in echoes]


class FunctionCallIn(FunctionCall):
    model_config = ConfigDict(frozen=True, extra="allow")


class ToolCallIn(ToolCall):
    """A call as a client sends it back (``openai_messages`` says what it may carry)."""

    model_config = ConfigDict(frozen=True, extra="allow")
    function: FunctionCallIn

    def refused(self) -> list[str]:
        # parsed_arguments: the SDK's parse() copy of the arguments, sent back beside them.
        fn = [f"function.{k}" for k in refused_fields(self.function, ("parsed_arguments",))]
        return refused_fields(self) + fn

    def as_call(self) -> dict[str, Any]:
        """The job's ``ToolCall`` fields."""
        function = {"name": self.function.name, "arguments": self.function.arguments}
        return {"id": self.id, "type": self.type, "function": function}


class FunctionChoice(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: FunctionChoice


def call_schema(tool: ToolSpec) -> dict[str, Any]:
    """The JSON Schema of one call ``{"name", "arguments"}`` to ``tool``."""
    return {
        "type": "object",
        "properties": {
            "name": {"const": tool.function.name},
            "arguments": tool.function.arguments_schema(),
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def calls_schema(tools: list[ToolSpec], parallel: bool) -> dict[str, Any]:
    """``required``'s schema: a JSON array of calls (one at most unless ``parallel``)."""
    items = call_schema(tools[0]) if len(tools) == 1 else {"anyOf": [call_schema(t) for t in tools]}
    schema: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def _refuse_strict(tools: list[ToolSpec]) -> None:
    """``strict`` promises arguments that follow the schema: kept under ``required`` or a
    named function, which constrain the output; ``auto``'s output is free text."""
    for i, tool in enumerate(tools):
        if tool.function.strict:
            raise ApiError(
                422,
                f"tools.{i}.function.strict: strict calls need tool_choice required or a named "
                "function (with auto the output is free text, read for calls afterwards)",
                param=f"tools.{i}.function.strict",
            )


class ChatTools(BaseModel):
    """The tool fields of ``ChatCompletionRequest``."""

    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: WireBool | None = None

    @property
    def tool_choice_name(self) -> str:
        choice = self.tool_choice or ("auto" if self.tools else "none")
        return choice if isinstance(choice, str) else f"function {choice.function.name}"

    def tool_mode(self) -> ToolMode | None:
        """How the output becomes calls; None: it is content only (no tools, or ``none``)."""
        choice = self.tool_choice or ("auto" if self.tools else "none")
        if not self.tools:
            if choice != "none":
                raise ApiError(422, "tool_choice: give tools to choose from", param="tool_choice")
            return None
        parallel = self.parallel_tool_calls is not False
        names = tuple(function_names(self.tools))
        if isinstance(choice, NamedToolChoice):
            if choice.function.name not in names:
                raise ApiError(422, f"tool_choice: no tool named {choice.function.name!r}",
                               param="tool_choice")  # fmt: skip
            return ToolMode("named", (choice.function.name,), parallel)
        if choice == "auto":
            _refuse_strict(self.tools)
        return None if choice == "none" else ToolMode(choice, names, parallel)

    def tool_structure(self) -> dict[str, Any] | None:
        """The constraint ``required`` or a named function puts on the output."""
        mode = self.tool_mode()
        if mode is None or mode.kind == "auto" or not self.tools:
            return None
        if mode.kind == "named":
            tool = next(t for t in self.tools if t.function.name == mode.names[0])
            schema = tool.function.arguments_schema()
        else:
            schema = calls_schema(self.tools, mode.parallel)
        return {"type": "json_schema", "schema": schema, "strict": True}

    def job_tools(self) -> list[dict[str, Any]] | None:
        """``JobSpec.tools``: the tools to render, none for ``tool_choice`` none."""
        if self.tool_mode() is None or not self.tools:
            return None
        return [t.model_dump(mode="json", exclude_none=True) for t in self.tools]
