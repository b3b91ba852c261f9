"""OpenAI's request bodies, and how their parameters become one job's fields.

Parameters we can honour map onto ``SamplingSpec``; ones we cannot (penalties, ``echo``,
``suffix``, logprobs) are refused with a 422 that names them rather than silently ignored, so a
client never believes it got behaviour it did not. Unknown fields are ignored, as OpenAI's SDKs
send new ones before servers know them. Numbers are strict, as on the wire (``WireInt``):
``"max_tokens": true`` or ``"2"`` is a 422, not 1 or 2.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import ApiError
from producer.protocol import MAX_CHOICES, WireBool, WireFloat, WireInt


class StreamOptions(BaseModel):
    include_usage: bool = False


class OpenAIRequest(BaseModel):
    """What both generation endpoints take: the sampling parameters and streaming options."""

    model_config = ConfigDict(extra="allow")

    model: str | None = Field(default=None, description="accepted and echoed back")
    max_tokens: WireInt | None = Field(default=None, ge=1)
    temperature: WireFloat | None = Field(default=None, ge=0.0, le=2.0)
    top_p: WireFloat | None = Field(default=None, gt=0.0, le=1.0)
    n: WireInt = Field(default=1, ge=1, le=MAX_CHOICES)
    stop: str | list[str] | None = None
    seed: WireInt | None = Field(default=None, ge=0, lt=2**63)
    stream: WireBool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, description="the job's tenant when auth is off")
    presence_penalty: WireFloat | None = None
    frequency_penalty: WireFloat | None = None

    def unsupported(self) -> list[str]:
        """Names of the parameters given with a value this gateway cannot honour."""
        names = [
            name
            for name in ("presence_penalty", "frequency_penalty")
            if getattr(self, name) not in (None, 0, 0.0)
        ]
        if self.model_extra:
            names += [k for k in ("logit_bias", "tools", "functions") if self.model_extra.get(k)]
        return names

    def sampling(self, max_tokens: int | None, default_max_tokens: int) -> dict[str, Any]:
        bad = self.unsupported()
        if bad:
            raise ApiError(422, f"not supported by this server: {', '.join(bad)}", param=bad[0])
        fields: dict[str, Any] = {"max_tokens": max_tokens or default_max_tokens, "n": self.n}
        if self.temperature is not None:
            fields["temperature"] = self.temperature
        if self.top_p is not None:
            fields["top_p"] = self.top_p
        if self.seed is not None:
            fields["seed"] = self.seed
        if self.stop:
            fields["stop"] = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        return fields

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def token_limit(self) -> int | None:
        """The completion's token cap as asked (chat also takes ``max_completion_tokens``):
        what the route and a batch line (``gateway.batch_lines``) pass to ``sampling``."""
        return self.max_tokens


class CompletionRequest(OpenAIRequest):
    """``POST /v1/completions``: one prompt, as text or token ids."""

    prompt: str | list[str] | list[WireInt]
    # OpenAI's default for this endpoint; an explicit null falls back to the server's default.
    max_tokens: WireInt | None = Field(default=16, ge=1)
    echo: bool = False
    suffix: str | None = None
    logprobs: WireInt | None = Field(default=None, ge=0)
    best_of: WireInt | None = Field(default=None, ge=1)

    def prompt_fields(self) -> dict[str, Any]:
        """``prompt`` or ``prompt_token_ids`` for ``build_spec``: one prompt per request (a
        batch of prompts is a batch of requests, each its own job)."""
        extra = [n for n in ("echo", "suffix", "logprobs") if getattr(self, n) not in (None, False)]
        if self.best_of not in (None, self.n):
            extra.append("best_of")
        if extra:
            raise ApiError(422, f"not supported by this server: {', '.join(extra)}", param=extra[0])
        prompt = self.prompt
        if isinstance(prompt, str):
            return {"prompt": prompt}
        if prompt and all(isinstance(p, int) for p in prompt):
            return {"prompt_token_ids": list(prompt)}
        if len(prompt) == 1 and isinstance(prompt[0], str):
            return {"prompt": prompt[0]}
        raise ApiError(422, "prompt: give one prompt (a string or a list of token ids)")


class ContentPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessageIn(BaseModel):
    # "developer" is OpenAI's new name for "system"; the chat template knows only the old one.
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None

    def as_message(self) -> dict[str, str]:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": content or ""}


class ChatCompletionRequest(OpenAIRequest):
    """``POST /v1/chat/completions``: the messages go through the model's chat template."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: WireInt | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: WireInt | None = Field(default=None, ge=0)

    def prompt_fields(self) -> dict[str, Any]:
        if self.logprobs or self.top_logprobs:
            raise ApiError(422, "not supported by this server: logprobs", param="logprobs")
        return {"messages": [m.as_message() for m in self.messages]}

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens
