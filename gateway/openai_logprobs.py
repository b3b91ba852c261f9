"""Token logprobs in OpenAI's two shapes, from the ``logprobs`` of the job's token events.

The gateway holds no tokenizer (it runs where torch does not), and a token event's text is
the detokenizer's increment, not one token's spelling, so a token is named by its id:
``"token_id:1234"``, the form vLLM's ``--return-tokens-as-token-ids`` uses, and ``bytes`` is
null. Values are the engine's: log-softmax of the raw logits (before temperature, penalties and
any structure mask), as vLLM reports them by default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from producer import AsyncProducer
from producer.protocol import TokenEvent, TokenLogprob, is_terminal


def token_name(token_id: int) -> str:
    return f"token_id:{token_id}"


def chat_logprobs(logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
    """A chat choice's (or chunk's) ``logprobs``: ``{"content": [...], "refusal": null}``."""
    content = [
        {
            "token": token_name(lp.token_id),
            "logprob": lp.logprob,
            "bytes": None,
            "top_logprobs": [
                {"token": token_name(t.token_id), "logprob": t.logprob, "bytes": None}
                for t in lp.top
            ],
        }
        for lp in logprobs
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
    """A completion choice's ``logprobs``: parallel lists; ``text_offset`` is null (see the
    module's note on token texts)."""
    return {
        "tokens": [token_name(lp.token_id) for lp in logprobs],
        "token_logprobs": [lp.logprob for lp in logprobs],
        "top_logprobs": [{token_name(t.token_id): t.logprob for t in lp.top} for lp in logprobs],
        "text_offset": None,
    }


class LogprobsByChoice:
    """Each choice's token logprobs in order, from token events (a repeated event skipped)."""

    def __init__(self) -> None:
        self.choices: dict[int, list[TokenLogprob]] = {}
        self._tokens: dict[int, int] = {}

    def add(self, event: TokenEvent) -> None:
        if event.index < self._tokens.get(event.choice, 0):
            return  # a worker's retried write: these tokens are in already
        self._tokens[event.choice] = event.index + len(event.token_ids)
        self.choices.setdefault(event.choice, []).extend(event.logprobs or ())

    def of(self, choice: int) -> list[TokenLogprob]:
        return self.choices.get(choice, [])


async def read_logprobs(producer: AsyncProducer, job_id: str) -> LogprobsByChoice:
    """The logprobs of an ended job, read back from its events stream (kept for the result
    TTL): a non-streamed request's result carries text only."""
    found, after = LogprobsByChoice(), "0"
    while True:
        batch = await producer.events(job_id, after)
        for event in batch:
            if isinstance(event, TokenEvent):
                found.add(event)
        if not batch or any(is_terminal(e) for e in batch):
            return found
        after = batch[-1].event_id or after
