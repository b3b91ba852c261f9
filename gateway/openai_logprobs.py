"""Token logprobs in OpenAI's two shapes, from the ``logprobs`` of the job's token events.

Each token is named by its own text and ``bytes`` as the worker sends them
(``producer.logprobs``: a token that is part of a character shows ``\\xNN`` escapes, its
``bytes`` exact); from a worker that sends ids only, by ``"token_id:1234"`` (the form vLLM's
``--return-tokens-as-token-ids`` uses) with ``bytes`` null. A completion's ``text_offset`` is
where each token starts in the choice's text, in characters, across a stream's chunks. Values
are the engine's: log-softmax of the logits after any structure mask, as vLLM reports them.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any

from producer import AsyncProducer
from producer.protocol import TokenEvent, TokenLogprob, TopLogprob, is_terminal


def token_name(lp: TopLogprob) -> str:
    return lp.text if lp.text is not None else f"token_id:{lp.token_id}"


def chat_logprobs(logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
    """A chat choice's (or chunk's) ``logprobs``: ``{"content": [...], "refusal": null}``."""
    content = [
        {
            "token": token_name(lp),
            "logprob": lp.logprob,
            "bytes": lp.utf8_bytes(),
            "top_logprobs": [
                {"token": token_name(t), "logprob": t.logprob, "bytes": t.utf8_bytes()}
                for t in lp.top
            ],
        }
        for lp in logprobs
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(
    logprobs: Sequence[TokenLogprob], text_offset: list[int] | None
) -> dict[str, Any]:
    """A completion choice's ``logprobs``: parallel lists (``TextOffsets`` the offsets)."""
    return {
        "tokens": [token_name(lp) for lp in logprobs],
        "token_logprobs": [lp.logprob for lp in logprobs],
        "top_logprobs": [{token_name(t): t.logprob for t in lp.top} for lp in logprobs],
        "text_offset": text_offset,
    }


class TextOffsets:
    """Where each token of each choice starts in its text, in characters, kept across calls
    (one response's chunks): a token that ends mid-character starts the next one's offset
    only once the character is whole."""

    def __init__(self) -> None:
        # By choice: the UTF-8 decoder of the bytes so far, and the characters it has made.
        self._choices: dict[int, tuple[codecs.IncrementalDecoder, list[int]]] = {}

    def next(self, choice: int, logprobs: Sequence[TokenLogprob]) -> list[int] | None:
        """The offsets of ``logprobs``, the choice's next tokens; None if any lacks its bytes
        (a worker that sends ids only)."""
        decoder, chars = self._choices.setdefault(
            choice, (codecs.getincrementaldecoder("utf-8")("replace"), [0])
        )
        offsets = []
        for lp in logprobs:
            raw = lp.utf8_bytes()
            if raw is None:
                return None
            offsets.append(chars[0])
            chars[0] += len(decoder.decode(bytes(raw)))
        return offsets


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
