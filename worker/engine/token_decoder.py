"""``tokenizer.decode`` as the detokenizer calls it, at a fraction of its per-call cost.

The detokenizer decodes two short windows per generated token. Through a Hugging Face fast
tokenizer's ``decode`` each call took 4.7 us on our 2-core machine, of which the Rust decoder
itself took 0.9 us: the rest is transformers' argument handling (``to_py_obj`` walks the id
list, kwargs are merged and checked). With ``clean_up_tokenization_spaces=False`` that method
returns exactly ``backend_tokenizer.decode(ids, skip_special_tokens)``, so for a tokenizer whose
``decode`` and ``_decode`` are the library's own, the backend is called directly. Any other
tokenizer (a subclass that overrides either, a slow tokenizer, a test's fake) goes through
``decode`` as before.

The second window of each step is usually one token (the one just read), and the text of one
id never changes, so single ids are decoded once per tokenizer and kept (at most one string
per vocabulary entry: ~2 MB for 49k ids).

For a byte-level BPE tokenizer it also holds each id's bytes (`byte_tokens`, checked against
the backend's ``decode`` when built: 0.1 s for 49k ids), so the detokenizer can skip decoding.
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

from worker.engine.byte_tokens import byte_level_table, whole_texts


class Tokenizer(Protocol):
    """The one method we need of a Hugging Face tokenizer (``PreTrainedTokenizerBase`` fits)."""

    def decode(
        self, token_ids: list[int], skip_special_tokens: bool = ..., **kwargs: Any
    ) -> str | list[str]: ...


class TokenDecoder:
    """``decode(ids)`` of one tokenizer with one ``skip_special_tokens`` setting."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool) -> None:
        self.direct = _backend(tokenizer)
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._single: dict[int, str] = {}
        # Each id's bytes where the backend's decoder is byte-level and agrees (else None).
        self.token_bytes = (
            None if self.direct is None else byte_level_table(self.direct, skip_special_tokens)
        )
        # With it, each id's text where its bytes are whole UTF-8 on their own (None where a
        # character is split across tokens): a token that follows whole characters is then
        # one lookup, without the incremental UTF-8 decoder's Python-level call.
        self.token_texts = None if self.token_bytes is None else whole_texts(self.token_bytes)

    def __call__(self, token_ids: list[int]) -> str:
        if len(token_ids) == 1:
            text = self._single.get(token_ids[0])
            if text is None:
                text = self._single[token_ids[0]] = self._decode(token_ids)
            return text
        if self.direct is not None:  # inlined: the hot path, one call frame fewer
            return self.direct.decode(token_ids, self._skip)
        return self._decode(token_ids)

    def _decode(self, token_ids: list[int]) -> str:
        if self.direct is not None:
            return self.direct.decode(token_ids, self._skip)
        # No clean-up: it rewrites " ." as "." after the space may already have been streamed.
        text = self._tokenizer.decode(
            token_ids, skip_special_tokens=self._skip, clean_up_tokenization_spaces=False
        )
        assert isinstance(text, str)
        return text


# One decoder (and its single-id texts) per live tokenizer and setting, shared by all requests.
_shared: weakref.WeakKeyDictionary[Any, dict[bool, TokenDecoder]] = weakref.WeakKeyDictionary()


def decoder_for(tokenizer: Tokenizer, skip_special_tokens: bool) -> TokenDecoder:
    """The shared `TokenDecoder` of ``tokenizer``; a private one if it cannot be weakly held."""
    try:
        by_setting = _shared.setdefault(tokenizer, {})
    except TypeError:  # not weak-referenceable or not hashable
        return TokenDecoder(tokenizer, skip_special_tokens)
    decoder = by_setting.get(skip_special_tokens)
    if decoder is None:
        decoder = by_setting[skip_special_tokens] = TokenDecoder(tokenizer, skip_special_tokens)
    return decoder


def _backend(tokenizer: Tokenizer) -> Any:
    """The Rust tokenizer whose ``decode`` is what ``tokenizer.decode`` does; None if none is."""
    try:
        from tokenizers import Tokenizer as RustTokenizer
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return None
    cls: Any = type(tokenizer)
    stock = (
        isinstance(tokenizer, PreTrainedTokenizerFast)
        and cls.decode is PreTrainedTokenizerFast.decode
        and getattr(cls, "_decode", None) is PreTrainedTokenizerFast._decode
    )
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not stock or not isinstance(backend, RustTokenizer):
        return None
    return backend
