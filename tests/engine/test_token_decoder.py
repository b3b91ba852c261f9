"""The detokenizer's decode: the Rust backend called directly must decode as the tokenizer does."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.engine.test_detokenizer import sp_tokenizer  # noqa: F401  (a fixture)
from worker.engine.detokenizer import IncrementalDetokenizer
from worker.engine.sampling_params import SamplingParams
from worker.engine.token_decoder import TokenDecoder, decoder_for


class Wrapped:
    """A tokenizer that is not a stock fast one: its ``decode`` is the only way in."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.calls = 0

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False, **kwargs: Any) -> Any:
        self.calls += 1
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs)


def random_ids(rng: random.Random, vocab: int, n: int) -> list[int]:
    """Mostly ordinary ids, with special ones (the first few) and byte tokens mixed in."""
    return [rng.randrange(0, 20) if rng.random() < 0.1 else rng.randrange(vocab) for _ in range(n)]


@pytest.fixture(params=["smol", "sp"])
def tokenizer(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue("smol_tokenizer" if request.param == "smol" else "sp_tokenizer")


def test_a_stock_fast_tokenizer_is_decoded_by_its_backend(tokenizer: Any) -> None:
    assert TokenDecoder(tokenizer, True).direct is not None
    assert TokenDecoder(Wrapped(tokenizer), True).direct is None

    class Overriding(type(tokenizer)):  # type: ignore[misc]
        def decode(self, token_ids: Any, skip_special_tokens: bool = False, **kw: Any) -> Any:
            return "overridden"

    overriding = Overriding.__new__(Overriding)
    assert TokenDecoder(overriding, True).direct is None


@pytest.mark.parametrize("skip", [True, False])
def test_windows_decode_as_the_tokenizer_does(tokenizer: Any, skip: bool) -> None:
    decoder = TokenDecoder(tokenizer, skip)
    rng = random.Random(7)
    for _ in range(2000):
        ids = random_ids(rng, len(tokenizer), rng.randint(1, 6))
        want = tokenizer.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
        assert decoder(ids) == want, ids
        assert decoder(ids) == want, ids  # single ids the second time come from the memo


@pytest.mark.parametrize("stop", [(), (" the", "e,", "\n")])
def test_streams_are_the_same_through_either_path(tokenizer: Any, stop: tuple[str, ...]) -> None:
    rng = random.Random(11)
    wrapped = Wrapped(tokenizer)
    for case in range(60):
        params = SamplingParams(stop=stop, skip_special_tokens=case % 3 != 0)
        prompt = random_ids(rng, len(tokenizer), 7)
        generated = random_ids(rng, len(tokenizer), 40)
        outs = []
        tokenizers: tuple[Any, ...] = (tokenizer, wrapped)
        for tok in tokenizers:
            detok = IncrementalDetokenizer(tok, prompt, params)
            deltas = []
            for i in range(0, len(generated), 1 + case % 3):
                deltas.append(detok.add_tokens(generated[i : i + 1 + case % 3]))
                if detok.stop_string is not None:
                    break
            deltas.append(detok.finish())
            outs.append((deltas, detok.stop_string, detok.text))
        if decoder_for(tokenizer, params.skip_special_tokens).token_bytes is None:
            assert outs[0] == outs[1], (prompt, generated)  # both windowed: the same deltas
            continue
        # Byte-level (`byte_tokens`): the same text and stop; its deltas never lag the window's
        # (the window holds all of its text while it ends in U+FFFD, the bytes only the split
        # character's first bytes), and what it streams ahead the window streams later.
        (fast, *end), (slow, *slow_end) = outs
        assert ("".join(fast), *end) == ("".join(slow), *slow_end), (prompt, generated)
        for k in range(len(fast)):
            assert "".join(fast[: k + 1]).startswith("".join(slow[: k + 1])), (prompt, generated)
    assert wrapped.calls > 0


def test_one_decoder_per_tokenizer_and_setting(tokenizer: Any) -> None:
    assert decoder_for(tokenizer, True) is decoder_for(tokenizer, True)
    assert decoder_for(tokenizer, True) is not decoder_for(tokenizer, False)
