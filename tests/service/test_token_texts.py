"""Logprob tokens named by their own text (issue 20): the tokenizer's piece with its byte
encoding undone, exact bytes where a token holds part of a character, and through Redis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from producer import Producer
from producer.logprobs import TokenLogprob
from producer.protocol import TokenEvent
from tests.service.conftest import running_worker, tiny_engine
from tests.service.test_worker import GREEDY
from worker.engine.sampler import TokenLogprobs
from worker.models.loader import load_tokenizer
from worker.service.token_texts import TokenTexts, wire_logprobs


def test_byte_level_pieces_give_the_bytes_of_the_text(smol_model_dir: Path) -> None:
    tokenizer = load_tokenizer(smol_model_dir)
    texts = TokenTexts(tokenizer)
    text = " the café 😀 日本"
    ids = tokenizer.encode(text)
    assert texts.of(ids[0]) == (" the", None)  # "Ġthe"
    named = [texts.of(i) for i in ids]
    assert any(raw is not None for _, raw in named)  # the emoji is split over two tokens
    joined = b"".join(bytes(raw) if raw is not None else t.encode() for t, raw in named)
    assert joined == text.encode("utf-8")
    partial = next(t for t, raw in named if raw is not None)
    assert "\\x" in partial  # shown as escapes, as OpenAI does
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert texts.of(eos) == ("<|im_end|>", None)  # a special token is its text


class _SentencePiece:
    """The two calls TokenTexts makes of a SentencePiece tokenizer (no fast backend)."""

    def convert_ids_to_tokens(self, token_id: int) -> Any:
        return {1: "<s>", 5: "\u2581hello", 6: "<0x0A>", 7: "<0xE6>"}.get(token_id)

    def get_added_vocab(self) -> dict[str, int]:
        return {"<s>": 1}


def test_sentencepiece_pieces_spaces_and_byte_fallback() -> None:
    texts = TokenTexts(_SentencePiece())
    assert texts.of(5) == (" hello", None)
    assert texts.of(6) == ("\n", None)
    assert texts.of(7) == ("\\xe6", (0xE6,))
    assert texts.of(1) == ("<s>", None)
    assert texts.of(99) == ("", None)  # past the tokenizer's vocabulary (a padded one)


def test_wire_logprobs_names_the_top_tokens_too(smol_model_dir: Path) -> None:
    texts = TokenTexts(load_tokenizer(smol_model_dir))
    engine_lp = TokenLogprobs(token_id=260, logprob=-0.5, rank=2, top=((253, -0.1), (260, -0.5)))
    (named,) = wire_logprobs([engine_lp], texts)
    assert (named.text, named.utf8_bytes(), named.rank) == (" the", list(b" the"), 2)
    assert [t.token_id for t in named.top] == [253, 260] and named.top[1].text == " the"
    (bare,) = wire_logprobs([engine_lp], None)
    assert bare.text is None and bare.utf8_bytes() is None  # as a worker before the field


@pytest.mark.slow
def test_token_events_carry_each_tokens_text(
    tiny_model_dir: Path, redis_url: str, prefix: str
) -> None:
    with (
        running_worker(tiny_engine(tiny_model_dir), redis_url, prefix),
        Producer(redis_url, prefix=prefix) as p,
    ):
        handle = p.submit("Hello there", max_tokens=6, logprobs=2, **GREEDY)
        result = handle.result(timeout_s=30)
        logprobs: list[TokenLogprob] = []
        for event in p.stream(handle.job_id, timeout_s=5):
            if isinstance(event, TokenEvent):
                logprobs += event.logprobs or ()
    assert [lp.token_id for lp in logprobs] == list(result.token_ids)
    assert all(lp.text is not None and all(t.text is not None for t in lp.top) for lp in logprobs)
    joined = b"".join(bytes(lp.utf8_bytes() or ()) for lp in logprobs)
    assert joined.decode("utf-8", "replace") == result.text
