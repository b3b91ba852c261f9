"""Turn a request's generated tokens into streamable text deltas, and find its stop strings.

Each step decodes only a sliding window of token ids, vLLM-style: ``[prefix, read)`` is text
already accounted for, ``[read, end)`` the new tokens; the delta is
``decode(ids[prefix:end])`` minus ``decode(ids[prefix:read])``. Decoding a few tokens of context,
rather than the new ones alone, keeps the spaces that BPE and SentencePiece decoders attach to (or
strip from) a window's first token. The window starts in the prompt's last few tokens, so a
SentencePiece "▁word" generated first keeps its space.

Text is held back while it ends in U+FFFD (a multi-byte UTF-8 character split across tokens), and
its last ``longest stop string - 1`` characters are held back while a stop string may still
complete there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from worker.engine.sampling_params import SamplingParams

# Prompt tokens decoded before the first generated one, as vLLM (INITIAL_INCREMENTAL_...OFFSET).
_PROMPT_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"


class Tokenizer(Protocol):
    """The one method we need of a Hugging Face tokenizer (``PreTrainedTokenizerBase`` fits)."""

    def decode(
        self, token_ids: list[int], skip_special_tokens: bool = ..., **kwargs: Any
    ) -> str | list[str]: ...


class IncrementalDetokenizer:
    """One request's output text, grown a few tokens at a time."""

    def __init__(
        self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = params.skip_special_tokens
        self._stops = params.stop
        self._include_stop = params.include_stop_str_in_output
        self._hold = max((len(s) for s in params.stop), default=1) - 1  # chars held for stops
        # ids = the prompt's last tokens + everything generated; offsets index into it.
        self._ids: list[int] = list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids)
        self._text = ""  # decoded output text (stop-truncated once a stop string matched)
        self._emitted = 0  # len of self._text already returned
        self._finished = False
        self.stop_string: str | None = None  # the stop string that matched, if one did

    @property
    def text(self) -> str:
        """The output text so far: what was returned plus what is held back."""
        return self._text

    def add_tokens(self, token_ids: Sequence[int]) -> str:
        """Take newly generated tokens; return the text that is now safe to stream."""
        if self._finished or self.stop_string is not None:
            raise RuntimeError("add_tokens after finish() or after a stop string matched")
        self._ids.extend(token_ids)
        new_text = self._decode(self._ids[self._prefix_offset :])
        # A decode ending in U+FFFD holds an incomplete UTF-8 character: wait for more tokens.
        # Text that did not grow (special tokens skipped) leaves the window as it is.
        if len(new_text) <= len(self._prefix_text) or new_text.endswith(_REPLACEMENT):
            return ""
        self._append(new_text)
        return self._release(final=self.stop_string is not None)

    def finish(self) -> str:
        """Flush what was held back; an invalid UTF-8 tail comes out as the tokenizer decodes it."""
        if not self._finished and self.stop_string is None:
            new_text = self._decode(self._ids[self._prefix_offset :])
            if len(new_text) > len(self._prefix_text):
                self._append(new_text)
        self._finished = True
        return self._release(final=True)

    def _append(self, new_text: str) -> None:
        """Add the window's new text, advance the window, and look for a stop string."""
        searched = len(self._text)
        self._text += new_text[len(self._prefix_text) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self._prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        if self._stops:
            self._check_stop(max(0, searched - self._hold))

    def _check_stop(self, start: int) -> None:
        """Truncate at the stop string that completes first in text[start:], if any.

        Earliest end (then earliest start) gives the same answer however tokens were chunked.
        """
        best: tuple[int, int, str] | None = None
        for stop in self._stops:
            pos = self._text.find(stop, start)
            if pos >= 0 and (best is None or (pos + len(stop), pos) < best[:2]):
                best = (pos + len(stop), pos, stop)
        if best is not None:
            end, pos, self.stop_string = best
            self._text = self._text[: end if self._include_stop else pos]

    def _release(self, final: bool) -> str:
        """Return unreturned text, less the tail a stop string could still start in."""
        safe = len(self._text) if final else len(self._text) - self._hold
        if safe <= self._emitted:
            return ""
        delta = self._text[self._emitted : safe]
        self._emitted = safe
        return delta

    def _decode(self, ids: list[int]) -> str:
        # No clean-up: it rewrites " ." as "." after the space may already have been streamed.
        text = self._tokenizer.decode(
            ids, skip_special_tokens=self._skip_special, clean_up_tokenization_spaces=False
        )
        assert isinstance(text, str)
        return text
