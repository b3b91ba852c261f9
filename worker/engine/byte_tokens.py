"""Byte-level BPE tokens as bytes: the detokenizer's fast path for GPT-2-style tokenizers.

A byte-level BPE decoder (the tokenizer's ``decoder`` is ``ByteLevel``: GPT-2, Llama 3, Qwen,
SmolLM2) maps each character of a token to one byte through GPT-2's fixed table, joins the
tokens' bytes and reads them as UTF-8, replacing what is invalid. So the text of a request's
generated ids is the UTF-8 decoding of their bytes joined, and it can grow by one table lookup
and one incremental UTF-8 decode a token, where the windowed path decodes two id windows through
the tokenizer (`detokenizer.py`). A token none of whose characters is missing from the table
(an added token such as ``<|im_end|>``) is its characters' bytes; one with a character outside
it is its own UTF-8, as the Rust decoder does. Special tokens are empty bytes when skipped.

The table is built once per tokenizer and setting and checked against the tokenizer's own
``decode`` (every id alone, seeded random sequences, and a multilingual text's own ids, whose
characters span tokens) before it is used; any disagreement, or any other decoder, keeps the
windowed path.
"""

from __future__ import annotations

import random
from typing import Any

# Random id sequences decoded both ways before a table is trusted: lengths 2-8, ids drawn half
# from the multi-byte tokens (which join into characters), half from the whole vocabulary.
_CHECK_SEQUENCES = 2000
_CHECK_SEED = 0
# Encoded and decoded back as well: characters of two, three and four bytes split across tokens
# the way real text splits them (random ids rarely join into a valid character).
_CHECK_TEXT = (
    "héllo wörld ñ ß Ωμ ∑√ 中文文本 日本語 한국어 😀👍🏽 \U0001f468\u200d\U0001f469 \t\r\n  x"
)


def gpt2_char_bytes() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: the character standing for each byte value.

    Printable Latin-1 bytes stand for themselves; the other 68 (controls, space, 0x7f-0xa0,
    0xad) are shifted to U+0100 upward, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    shifted = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + shifted)
            shifted += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _token_bytes(token: str, char_bytes: dict[str, int]) -> bytes:
    try:
        return bytes([char_bytes[c] for c in token])
    except KeyError:  # a character outside the alphabet: the token is its own text
        return token.encode("utf-8")


def byte_level_table(backend: Any, skip_special_tokens: bool) -> list[bytes] | None:
    """Each id's bytes for a Rust tokenizer whose decoder is byte-level, checked against its
    ``decode``; None for any other decoder or on any disagreement."""
    try:
        from tokenizers.decoders import ByteLevel
    except ImportError:
        return None
    if not isinstance(getattr(backend, "decoder", None), ByteLevel):
        return None
    size = backend.get_vocab_size(with_added_tokens=True)
    added = backend.get_added_tokens_decoder()
    size = max(size, max(added, default=-1) + 1)
    char_bytes = gpt2_char_bytes()
    table: list[bytes] = []
    for token_id in range(size):
        token = backend.id_to_token(token_id)
        special = token_id in added and added[token_id].special
        skipped = token is None or (skip_special_tokens and special)
        table.append(b"" if skipped else _token_bytes(token, char_bytes))
    return table if _agrees(backend, table, skip_special_tokens) else None


def _agrees(backend: Any, table: list[bytes], skip_special_tokens: bool) -> bool:
    """Whether ``table`` decodes as ``backend.decode`` does: each id alone, then sequences
    (a token of continuation bytes alone decodes to U+FFFD whatever its bytes: only a sequence
    that completes its character checks them)."""
    singles = [[token_id] for token_id in range(len(table))]
    rng = random.Random(_CHECK_SEED)
    multibyte = [i for i, data in enumerate(table) if data and max(data) >= 0x80]
    pool = multibyte or list(range(len(table)))
    sequences = [
        [rng.choice(pool) if rng.random() < 0.5 else rng.randrange(len(table)) for _ in range(n)]
        for n in (rng.randint(2, 8) for _ in range(_CHECK_SEQUENCES))
    ]
    batch = [*singles, *sequences, backend.encode(_CHECK_TEXT, add_special_tokens=False).ids]
    expected = backend.decode_batch(batch, skip_special_tokens=skip_special_tokens)
    return all(
        b"".join(table[i] for i in ids).decode("utf-8", "replace") == text
        for ids, text in zip(batch, expected, strict=True)
    )


def whole_texts(table: list[bytes]) -> list[str | None]:
    """Each id's text where its bytes are complete, valid UTF-8 alone; None where they are not
    (part of a character split across tokens). Such a token, after whole characters, adds
    exactly this text: what an incremental UTF-8 decoder with nothing held would return."""
    texts: list[str | None] = []
    for data in table:
        try:
            texts.append(data.decode("utf-8"))
        except UnicodeDecodeError:
            texts.append(None)
    return texts
