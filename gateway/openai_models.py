"""OpenAI's request bodies, and how their parameters become one job's fields.

Parameters we can honour map onto ``SamplingSpec`` (whose ranges apply: a value out of them is
a 422 naming ``sampling.<field>``), ``response_format`` onto its ``structure`` constraint, and
``tools`` / ``tool_choice`` onto the job's tools and, for ``required`` or a named function, a
constraint on the call's JSON (``openai_tools``). Ones we cannot (``echo``, ``suffix``,
``best_of`` other than ``n``, legacy ``functions``, vLLM's ``guided_*``) are refused with a
422 that names them rather than silently ignored, so a client never believes it got behaviour
it did not. Other unknown fields of the request are ignored, as OpenAI's SDKs send new ones
before servers know them; a message's are refused when given a value (``openai_messages``).
Numbers are strict, as on the wire (``WireInt``): ``"max_tokens": true`` or ``"2"`` is a 422,
not 1 or 2.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import ApiError
from gateway.openai_messages import ChatMessageIn, job_messages
from gateway.openai_tools import ChatTools, ResponseFormat
from producer.protocol import MAX_CHOICES, WireBool, WireFloat, WireInt
from producer.webhook_spec import WebhookSpec

# SamplingSpec's fields a request passes through under the same name when given (vLLM's
# extras among them: repetition_penalty, top_k, min_p); past OpenAI's own, the spec's ranges.
PASSED_THROUGH = (
    "temperature",
    "top_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "top_k",
    "min_p",
)
# Known parameters nothing here honours: refused by name, never ignored.
REFUSED_EXTRAS = ("functions", "function_call", "guided_json", "guided_regex", "guided_choice",
                  "guided_grammar", "guided_decoding_backend")  # fmt: skip


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
    repetition_penalty: WireFloat | None = Field(default=None, description="vLLM's extra")
    logit_bias: dict[str, WireFloat] | None = Field(
        default=None, description="token id (as a string) -> bias added to its logit"
    )
    top_k: WireInt | None = Field(default=None, description="vLLM's extra")
    min_p: WireFloat | None = Field(default=None, description="vLLM's extra")
    response_format: ResponseFormat | None = None
    webhook: WebhookSpec | None = Field(
        default=None,
        description="Paternoster's extension, not OpenAI's (extra_body): POSTed, signed, when "
        "the job ends (docs/webhooks.md)",
    )

    def unsupported(self) -> list[str]:
        """Names of the parameters given with a value this gateway cannot honour."""
        extra = self.model_extra or {}
        return [k for k in REFUSED_EXTRAS if extra.get(k) is not None]

    def structure(self) -> dict[str, Any] | None:
        """The output's constraint: ``response_format``'s (chat adds the tools' own)."""
        return None if self.response_format is None else self.response_format.structure()

    def logprobs_count(self) -> int | None:
        """``SamplingSpec.logprobs``: the top alternatives per token (None: no logprobs)."""
        return None

    def sampling(self, max_tokens: int | None, default_max_tokens: int) -> dict[str, Any]:
        """The job's sampling fields, flat, for ``build_spec``."""
        bad = self.unsupported()
        if bad:
            raise ApiError(422, f"not supported by this server: {', '.join(bad)}", param=bad[0])
        fields: dict[str, Any] = {"max_tokens": max_tokens or default_max_tokens, "n": self.n}
        fields.update({k: getattr(self, k) for k in PASSED_THROUGH if getattr(self, k) is not None})
        optional = {"structure": self.structure(), "logprobs": self.logprobs_count()}
        fields.update({k: v for k, v in optional.items() if v is not None})
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

    def logprobs_count(self) -> int | None:
        return self.logprobs

    def prompt_fields(self) -> dict[str, Any]:
        """``prompt`` or ``prompt_token_ids`` for ``build_spec``: one prompt per request (a
        batch of prompts is a batch of requests, each its own job)."""
        extra = [n for n in ("echo", "suffix") if getattr(self, n) not in (None, False)]
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


class ChatCompletionRequest(ChatTools, OpenAIRequest):
    """``POST /v1/chat/completions``: the messages (and tools) go through the model's chat
    template."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: WireInt | None = Field(default=None, ge=1)
    logprobs: WireBool = False
    top_logprobs: WireInt | None = Field(default=None, ge=0)

    def logprobs_count(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise ApiError(422, "top_logprobs needs logprobs: true", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None

    def structure(self) -> dict[str, Any] | None:
        tools, formats = self.tool_structure(), super().structure()
        if tools is not None and formats is not None:
            raise ApiError(
                422,
                f"response_format and tool_choice {self.tool_choice_name} both constrain the "
                "output: give one",
                param="response_format",
            )
        return tools if tools is not None else formats

    def prompt_fields(self) -> dict[str, Any]:
        messages = job_messages(self.messages)
        tools = self.job_tools()
        return {"messages": messages, **({"tools": tools} if tools is not None else {})}

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens
