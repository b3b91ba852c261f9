"""Token logprobs on the wire: a token event's ``logprobs``, one entry per token it carries.

Each token is named by its id and, from workers that fill it, by its own text: the token's
bytes (the tokenizer's piece with its byte encoding undone: SmolLM2's ``Ġthe`` is `` the``),
decoded as UTF-8. A token that holds only part of a character (a byte-level vocabulary splits
many emoji and CJK characters over two or three tokens) is not valid UTF-8 alone: its ``text``
then shows the bytes as ``\\xNN`` escapes and ``token_bytes`` carries them exactly; for every
other token ``token_bytes`` is null and the bytes are ``text``'s UTF-8. OpenAI's ``bytes`` is
either. Both fields are additive with defaults (schema version 1): a worker from before them
sends ids only.
"""

from __future__ import annotations

from producer.wire import Frozen


class TopLogprob(Frozen):
    token_id: int
    logprob: float
    text: str | None = None  # the token's own text; None from a worker before this field
    token_bytes: tuple[int, ...] | None = None  # only where the bytes are not UTF-8 alone

    def utf8_bytes(self) -> list[int] | None:
        """The token's bytes as OpenAI's ``bytes`` list (None: the worker sent no text)."""
        if self.token_bytes is not None:
            return list(self.token_bytes)
        return None if self.text is None else list(self.text.encode("utf-8"))


class TokenLogprob(TopLogprob):
    rank: int  # 1 + the number of tokens strictly more likely than this one
    top: tuple[TopLogprob, ...] = ()  # the most likely tokens at this position, best first
