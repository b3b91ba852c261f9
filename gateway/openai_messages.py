"""A chat request's messages as OpenAI sends them, and which of their fields we honour.

A message's ``role``, ``content`` (a string, or text parts), ``name`` (the participant's, on
system, user and assistant messages: ``worker.engine.chat_tools`` renders it), an assistant's
``tool_calls`` and a tool message's ``tool_call_id`` become the job's ``ChatMessage``. Every
other field is refused by name when it carries a value (``audio``, ``refusal``, the legacy
``function_call``, ``annotations``, anything unknown): a 422 naming ``messages.<i>.<field>``.
A null is what leaving a field out means, and is accepted: the ``openai`` SDK sends an assistant
message it got back with ``refusal``, ``audio``, ``function_call`` and ``annotations`` null when
the message is passed back as ``model_dump()``. So is ``parsed`` (``parsed_arguments`` on a
call): the SDK's own copy of a ``parse()`` result's ``content`` (a call's ``arguments``), which
we honour as sent.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from gateway.errors import ApiError
from gateway.openai_tools import ToolCallIn, refused_fields
from producer.messages import FunctionName


class ContentPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    # The SDK's client-side copy of the content it parsed (``chat.completions.parse``).
    ECHOES: ClassVar[tuple[str, ...]] = ("parsed",)

    # "developer" is OpenAI's new name for "system"; the chat template knows only the old one.
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: FunctionName | None = None  # the participant's name
    tool_calls: list[ToolCallIn] | None = None  # an assistant's calls, sent back next turn
    tool_call_id: str | None = None  # a tool message: the call it answers

    def refused(self) -> list[str]:
        """The fields given a value this gateway cannot honour, by their path in the message."""
        bad = refused_fields(self, self.ECHOES)
        for i, call in enumerate(self.tool_calls or ()):
            bad += [f"tool_calls.{i}.{name}" for name in call.refused()]
        return bad

    def as_message(self) -> dict[str, Any]:
        """The job's ``ChatMessage`` fields (``producer.messages`` checks them)."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        role = "system" if self.role == "developer" else self.role
        message: dict[str, Any] = {"role": role, "content": content or ""}
        if self.tool_calls:
            message["tool_calls"] = [call.as_call() for call in self.tool_calls]
        optional = {"tool_call_id": self.tool_call_id, "name": self.name}
        message.update({k: v for k, v in optional.items() if v is not None})
        return message


def job_messages(messages: list[ChatMessageIn]) -> list[dict[str, Any]]:
    """``JobSpec.messages``; a 422 naming the first field given that is not honoured."""
    for i, message in enumerate(messages):
        bad = message.refused()
        if bad:
            where = f"messages.{i}.{bad[0]}"
            raise ApiError(422, f"{where}: not supported by this server (send null or leave it "
                           "out)", param=where)  # fmt: skip
    return [m.as_message() for m in messages]
