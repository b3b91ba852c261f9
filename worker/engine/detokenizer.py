"""Turn a request's generated tokens into streamable text deltas, and find its stop strings.

Each step decodes only a sliding window of token ids, vLLM-style: ``[prefix, read)`` is text
already accounted for, ``[read, end)`` the new tokens; the delta is
``decode(ids[prefix:end])`` minus ``decode(ids[prefix:read])``. Decoding a few tokens of context,
rather than the new ones alone, keeps the spaces that BPE and SentencePiece decoders attach to (or
strip from) a window's first token. The window starts in the prompt's last few tokens, so a
SentencePiece "▁word" generated first keeps its space.

A byte-level BPE tokenizer's ids are read as bytes instead (`byte_tokens`): its text is the
UTF-8 decoding of the generated tokens' bytes joined, so each token costs one lookup and one
incremental UTF-8 decode (which holds back a split character's bytes itself), no window.

Text is held back while it ends in U+FFFD (a multi-byte UTF-8 character split across tokens), and
its last ``longest stop string - 1`` characters are held back while a stop string may still
complete there.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from worker.engine.sampling_params import SamplingParams
from worker.engine.token_decoder import Tokenizer, decoder_for

# Prompt tokens decoded before the first generated one, as vLLM (INITIAL_INCREMENTAL_...OFFSET).
_PROMPT_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"
_UTF8 = codecs.getincrementaldecoder("utf-8")
__all__ = ["IncrementalDetokenizer", "Tokenizer"]


class IncrementalDetokenizer:
    """One request's output text, grown a few tokens at a time."""

    def __init__(
        self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> None:
        self._decode = decoder_for(tokenizer, params.skip_special_tokens)
        self._stops = params.stop
        self._include_stop = params.include_stop_str_in_output
        self._hold = max((len(s) for s in params.stop), default=1) - 1  # chars held for stops
        # Byte-level: each id's bytes, and the decoder holding a split character's first bytes.
        self._bytes = self._decode.token_bytes
        self._utf8 = _UTF8("replace")
        # Byte-level without stop strings: a token of whole characters, while the UTF-8 decoder
        # holds no split character's bytes (`_whole`), adds its table text (`add_token`).
        self._texts = self._decode.token_texts if not self._stops else None
        self._whole = True
        # Else ids = the prompt's last tokens + everything generated; offsets index into it.
        self._ids: list[int] = list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._prefix_text = "" if self._bytes is not None else self._decode(self._ids)
        # The output text (stop-truncated once a stop string matched) is the returned pieces
        # then the tail held back. Kept apart, a token's text is not appended to the whole
        # text: that copy grew with the output (a string is immutable), ~3 us a token at 32k
        # characters.
        self._returned: list[str] = []
        self._tail = ""
        self._finished = False
        self.stop_string: str | None = None  # the stop string that matched, if one did

    @property
    def text(self) -> str:
        """The output text so far: what was returned plus what is held back."""
        return "".join(self._returned) + self._tail

    def add_token(self, token_id: int) -> str:
        """`add_tokens` of one id. Byte-level with no stop string, a token of whole characters
        after whole characters is one lookup: the engine's per-row call each decode step."""
        texts = self._texts
        if texts is not None and self._whole and 0 <= token_id < len(texts):
            text = texts[token_id]
            if text is not None:
                if text:
                    self._returned.append(text)
                return text
        return self.add_tokens((token_id,))

    def add_tokens(self, token_ids: Sequence[int]) -> str:
        """Take newly generated tokens; return the text that is now safe to stream."""
        if self._finished or self.stop_string is not None:
            raise RuntimeError("add_tokens after finish() or after a stop string matched")
        table = self._bytes
        if table is not None:
            size = len(table)  # an id past the tokenizer's vocabulary decodes to nothing
            if len(token_ids) == 1:
                token_id = token_ids[0]
                data = table[token_id] if 0 <= token_id < size else b""
            else:
                data = b"".join(table[i] for i in token_ids if 0 <= i < size)
            added = self._utf8.decode(data)
            if self._texts is not None:
                self._whole = not self._utf8.getstate()[0]
            if not added:
                return ""
            if not self._stops:  # nothing is held back for a stop string: all of it streams
                self._returned.append(added)
                return added
            self._add(added)
            return self._release(final=self.stop_string is not None)
        self._ids.extend(token_ids)
        new_text = self._decode(self._ids[self._prefix_offset :])
        # A decode ending in U+FFFD holds an incomplete UTF-8 character: wait for more tokens.
        # Text that did not grow (special tokens skipped) leaves the window as it is.
        known = len(self._prefix_text)
        if len(new_text) <= known or new_text[-1] == _REPLACEMENT:
            return ""
        self._append(new_text[known:])
        return self._release(final=self.stop_string is not None)

    def finish(self) -> str:
        """Flush what was held back; an invalid UTF-8 tail comes out as the tokenizer decodes it."""
        if not self._finished and self.stop_string is None:
            if self._bytes is not None:
                added = self._utf8.decode(b"", final=True)  # a split character's bytes: U+FFFD
                if added:
                    self._add(added)
            else:
                new_text = self._decode(self._ids[self._prefix_offset :])
                known = len(self._prefix_text)
                if len(new_text) > known:
                    self._append(new_text[known:])
        self._finished = True
        self._texts = None  # `add_token` then raises, as `add_tokens` does
        return self._release(final=True)

    def _append(self, added: str) -> None:
        """Add the window's new text, advance the window, and look for a stop string."""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self._prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        self._add(added)

    def _add(self, added: str) -> None:
        """Add new text to the tail held back, and look for a stop string in it."""
        searched = len(self._tail)
        self._tail += added
        if self._stops:
            # Everything before the tail's last ``hold`` characters was searched already.
            self._check_stop(max(0, searched - self._hold))

    def _check_stop(self, start: int) -> None:
        """Truncate at the stop string that completes first in tail[start:], if any.

        Earliest end (then earliest start) gives the same answer however tokens were chunked.
        """
        best: tuple[int, int, str] | None = None
        for stop in self._stops:
            pos = self._tail.find(stop, start)
            if pos >= 0 and (best is None or (pos + len(stop), pos) < best[:2]):
                best = (pos + len(stop), pos, stop)
        if best is not None:
            end, pos, self.stop_string = best
            self._tail = self._tail[: end if self._include_stop else pos]

    def _release(self, final: bool) -> str:
        """Return the held-back text, less the tail a stop string could still start in."""
        tail = self._tail
        safe = len(tail) if final else len(tail) - self._hold
        if safe <= 0:
            return ""
        delta, self._tail = tail[:safe], tail[safe:]
        self._returned.append(delta)
        return delta
