"""Prompts to token ids, and the checks every prompt must pass before it may run.

Shared by the engine and the job service's intake (which tokenizes on its own thread with its own
tokenizer, so a prompt that can never run is rejected before the job is marked started); the
checks run as part of ``engine_request.validate_request``, a request's one admission check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from producer.messages import ChatMessage, ToolSpec
from worker.engine.chat_tools import template_arguments

# Chat messages as the engine takes them: the job's models, or dicts of their fields.
Messages = Sequence[Mapping[str, Any] | ChatMessage]


class InvalidRequestError(ValueError):
    """The request can never run (empty or too long a prompt, a duplicate id)."""


class PromptTooLongError(InvalidRequestError):
    """The prompt leaves no room for a generated token in the model's context."""


def encode_prompt(
    tokenizer: Any,
    prompt: str | Messages,
    model_dir: Path | str = "",
    tools: Sequence[ToolSpec] | None = None,
) -> list[int]:
    """Token ids of a prompt; chat messages (and the function ``tools`` they may call) go
    through the model's chat template (``chat_tools``: its own tool rendering when it has one,
    else the generic template)."""
    if isinstance(prompt, str):
        if tools:
            raise InvalidRequestError("tools are rendered with chat messages: send messages")
        return list(tokenizer.encode(prompt))
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidRequestError(f"{model_dir or 'the model'} has no chat template: send a prompt")
    try:
        messages = [m if isinstance(m, ChatMessage) else ChatMessage.model_validate(m)
                    for m in prompt]  # fmt: skip
    except ValidationError as exc:
        raise InvalidRequestError(f"invalid chat message: {exc.errors()[0]['msg']}") from None
    conversation, template_tools = template_arguments(tokenizer, messages, tools)
    text = tokenizer.apply_chat_template(
        conversation, tools=template_tools, add_generation_prompt=True, tokenize=False
    )
    # The template already holds BOS and the role markers: add no special tokens again.
    return list(tokenizer.encode(text, add_special_tokens=False))


def check_prompt(ids: Sequence[int], max_model_len: int, vocab_size: int) -> None:
    """Raise unless the prompt is non-empty, in the vocabulary and leaves room for one token."""
    if not ids:
        raise InvalidRequestError("the prompt is empty")
    if len(ids) >= max_model_len:
        raise PromptTooLongError(
            f"the prompt has {len(ids)} tokens; this engine fits at most "
            f"{max_model_len - 1} (max_model_len {max_model_len}: the smaller of the model's "
            "context and the whole KV pool, prompt plus at least one generated token)"
        )
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(f"token ids out of range [0, {vocab_size}): {bad[:5]}")
