"""Each token's own text for the wire's logprobs (``producer.logprobs``), from the tokenizer.

The engine's logprobs carry ids; a client of the OpenAI API reads each token's text and bytes.
A token's bytes are its vocabulary piece with the tokenizer's byte encoding undone: byte-level
BPE (GPT-2, SmolLM2, Llama 3, Qwen) spells each byte as a printable character (``Ġ`` is a
space); SentencePiece spells a space ``▁`` and an unknown byte ``<0xNN>``. Added and special
tokens are their text. Built per token at first use and kept (at most the vocabulary: 49,152
entries for SmolLM2), and only for jobs that ask for logprobs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from producer.logprobs import TokenLogprob, TopLogprob
from worker.engine.sampler import TokenLogprobs

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SPACE_PIECE = "\u2581"  # SentencePiece's word boundary, a space in the text

# A token's text and, when its bytes are not UTF-8 on their own, the bytes.
TokenText = tuple[str, tuple[int, ...] | None]


def _byte_level_chars() -> dict[str, int]:
    """Byte-level BPE's character for each byte -> the byte: the 188 printable bytes stand for
    themselves, the other 68 (controls, space, ...) for the characters from U+0100 on, in order."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    chars = {chr(b): b for b in printable}
    shifted = (b for b in range(256) if b not in printable)
    chars.update((chr(0x100 + n), b) for n, b in enumerate(shifted))
    return chars


class TokenTexts:
    """Token id -> ``TokenText`` for one tokenizer (the model loop's thread only)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)  # None: a slow tokenizer
        decoder = None if backend is None else backend.decoder
        # The decoder's own JSON (a few hundred bytes; the whole tokenizer's is megabytes).
        spec = b"" if decoder is None else decoder.__getstate__()
        self._byte_level = _byte_level_chars() if b'"ByteLevel"' in spec else None
        self._added = {int(i) for i in tokenizer.get_added_vocab().values()}
        self._known: dict[int, TokenText] = {}

    def of(self, token_id: int) -> TokenText:
        known = self._known.get(token_id)
        if known is None:
            raw = self.token_bytes(token_id)
            try:
                known = (raw.decode("utf-8"), None)
            except UnicodeDecodeError:  # part of a character: escapes, as OpenAI shows it
                known = (raw.decode("utf-8", "backslashreplace"), tuple(raw))
            self._known[token_id] = known
        return known

    def token_bytes(self, token_id: int) -> bytes:
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        if not isinstance(piece, str):  # an id the tokenizer does not know (padded vocabulary)
            return b""
        if token_id in self._added:
            return piece.encode("utf-8")
        if self._byte_level is not None:
            chars = self._byte_level
            if all(c in chars for c in piece):
                return bytes(chars[c] for c in piece)
            return piece.encode("utf-8")
        if (byte := _BYTE_PIECE.fullmatch(piece)) is not None:
            return bytes([int(byte.group(1), 16)])
        return piece.replace(_SPACE_PIECE, " ").encode("utf-8")


def wire_logprobs(
    logprobs: Sequence[TokenLogprobs], texts: TokenTexts | None
) -> tuple[TokenLogprob, ...]:
    """The engine's logprobs as the wire's, each token with its text (ids only: no ``texts``)."""

    def named(token_id: int) -> dict[str, Any]:
        if texts is None:
            return {}
        text, raw = texts.of(token_id)
        return {"text": text, "token_bytes": raw}

    return tuple(
        TokenLogprob(
            token_id=lp.token_id,
            logprob=lp.logprob,
            rank=lp.rank,
            top=tuple(TopLogprob(token_id=t, logprob=v, **named(t)) for t, v in lp.top),
            **named(lp.token_id),
        )
        for lp in logprobs
    )
