"""The detokenizer's byte-level path (`byte_tokens`) against the windowed one and the tokenizer."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.test_detokenizer import (
    ALPHABET,
    CHAT_PROMPT,
    FFFD,
    STOP_SLICES,
    TEXTS,
    encode,
    stops_of,
    stream,
)
from worker.engine.byte_tokens import _agrees, byte_level_table, gpt2_char_bytes
from worker.engine.detokenizer import IncrementalDetokenizer
from worker.engine.sampling_params import SamplingParams
from worker.engine.token_decoder import decoder_for


class Windowed:
    """The same tokenizer behind a ``decode`` of its own: not the library's, so the detokenizer
    takes the windowed path (no direct backend, no byte table)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True, **kw: Any) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens, **kw))


def test_the_alphabet_is_gpt2s_and_a_bijection(smol_tokenizer: Any) -> None:
    char_bytes = gpt2_char_bytes()
    assert sorted(char_bytes.values()) == list(range(256))
    assert (char_bytes["Ġ"], char_bytes["Ċ"], char_bytes["a"], char_bytes["ĉ"]) == (32, 10, 97, 9)
    # Every character of every token of the model's vocabulary (added tokens aside) is in it.
    backend = smol_tokenizer.backend_tokenizer
    added = backend.get_added_tokens_decoder()
    vocab = [t for t, i in backend.get_vocab(with_added_tokens=False).items() if i not in added]
    assert len(vocab) > 49_000 and all(c in char_bytes for t in vocab for c in t)


@pytest.mark.parametrize("skip", [True, False])
def test_smollm2s_table_is_built_and_used(smol_tokenizer: Any, skip: bool) -> None:
    table = decoder_for(smol_tokenizer, skip).token_bytes
    assert table is not None and len(table) == 49152
    im_end = smol_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert table[im_end] == (b"" if skip else b"<|im_end|>")
    assert table[smol_tokenizer.convert_tokens_to_ids("Ġworld")] == b" world"
    detok = IncrementalDetokenizer(smol_tokenizer, [1], SamplingParams(skip_special_tokens=skip))
    assert detok._bytes is table


def test_other_decoders_keep_the_windowed_path(smol_tokenizer: Any) -> None:
    from tokenizers import decoders

    assert decoder_for(Windowed(smol_tokenizer), True).token_bytes is None
    backend = smol_tokenizer.backend_tokenizer.__class__.from_str(
        smol_tokenizer.backend_tokenizer.to_str()
    )
    backend.decoder = decoders.Sequence([decoders.ByteLevel()])  # same text, another decoder
    assert byte_level_table(backend, True) is None


def test_a_table_that_disagrees_with_decode_is_refused(smol_tokenizer: Any) -> None:
    backend = smol_tokenizer.backend_tokenizer
    table = byte_level_table(backend, True)
    assert table is not None and _agrees(backend, table, True)
    i, j = encode(smol_tokenizer, " A")[0], encode(smol_tokenizer, " B")[0]
    table[i], table[j] = table[j], table[i]
    assert not _agrees(backend, table, True)
    # A split character's bytes wrong: only a sequence that joins them (the check's text)
    # can show it.
    emoji = encode(smol_tokenizer, "😀")
    table = byte_level_table(backend, True)
    assert table is not None
    table[emoji[-1]] = bytes([table[emoji[-1]][0] ^ 0x01, *table[emoji[-1]][1:]])
    assert not _agrees(backend, table, True)


@pytest.mark.parametrize("chunk", [1, 2, 7])
@pytest.mark.parametrize("text", TEXTS)
def test_both_paths_stream_the_same_deltas_text(smol_tokenizer: Any, text: str, chunk: int) -> None:
    prompt = encode(smol_tokenizer, CHAT_PROMPT)
    generated = encode(smol_tokenizer, text)
    fast, _ = stream(smol_tokenizer, prompt, generated, chunk=chunk)
    slow, _ = stream(Windowed(smol_tokenizer), prompt, generated, chunk=chunk)
    assert "".join(fast) == "".join(slow) == text
    assert not any(FFFD in d for d in fast)


def test_ids_past_the_vocabulary_decode_to_nothing(smol_tokenizer: Any) -> None:
    for ids in ([10**6], [-1], [10**6, *encode(smol_tokenizer, "ok")]):
        fast, _ = stream(smol_tokenizer, [], ids)
        assert "".join(fast) == smol_tokenizer.decode([i for i in ids if i >= 0])


def test_a_split_character_at_the_end_comes_out_as_decode_says(smol_tokenizer: Any) -> None:
    partial = encode(smol_tokenizer, "😀")[:2]
    for generated in (partial, partial + partial, [*encode(smol_tokenizer, "x"), *partial]):
        fast, _ = stream(smol_tokenizer, [], generated, SamplingParams(stop=("zz",)))
        slow, _ = stream(Windowed(smol_tokenizer), [], generated, SamplingParams(stop=("zz",)))
        assert "".join(fast) == "".join(slow) == smol_tokenizer.decode(generated)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    pieces=st.lists(ALPHABET, max_size=40),
    chunk=st.integers(1, 5),
    stop_slices=STOP_SLICES,
    include=st.booleans(),
    skip=st.booleans(),
)
def test_both_paths_agree_on_random_text_with_stops(
    smol_tokenizer: Any,
    pieces: list[str],
    chunk: int,
    stop_slices: list[tuple[int, int]],
    include: bool,
    skip: bool,
) -> None:
    text = "".join(pieces)
    stops = stops_of(text, stop_slices)
    im_end = smol_tokenizer.convert_tokens_to_ids("<|im_end|>")
    generated = [*encode(smol_tokenizer, text[: len(text) // 2]), im_end]
    generated += encode(smol_tokenizer, text[len(text) // 2 :])
    params = SamplingParams(
        stop=stops, include_stop_str_in_output=include, skip_special_tokens=skip
    )
    prompt = encode(smol_tokenizer, "Q: ")
    fast, fast_detok = stream(smol_tokenizer, prompt, generated, params, chunk)
    slow, slow_detok = stream(Windowed(smol_tokenizer), prompt, generated, params, chunk)
    assert "".join(fast) == fast_detok.text == "".join(slow) == slow_detok.text
    assert fast_detok.stop_string == slow_detok.stop_string


def test_whole_texts_are_the_tokens_that_decode_alone(smol_tokenizer: Any) -> None:
    decoder = decoder_for(smol_tokenizer, True)
    assert decoder.token_bytes is not None and decoder.token_texts is not None
    split = 0
    for data, text in zip(decoder.token_bytes, decoder.token_texts, strict=True):
        if text is None:  # part of a character: not valid UTF-8 alone
            split += 1
            with pytest.raises(UnicodeDecodeError):
                data.decode("utf-8")
        else:
            assert text == data.decode("utf-8")
    assert split > 0  # the smol vocabulary has byte-fallback pieces of multi-byte characters


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("text", TEXTS)
def test_one_token_at_a_time_streams_as_add_tokens(
    smol_tokenizer: Any, text: str, skip: bool
) -> None:
    """`add_token`'s lookup against `add_tokens`, across characters split over tokens, a
    special token, ids past the vocabulary, and finish."""
    im_end = smol_tokenizer.convert_tokens_to_ids("<|im_end|>")
    half = len(text) // 2
    partial = encode(smol_tokenizer, "😀")[:2]  # two of its four bytes, then whole tokens
    generated = [*encode(smol_tokenizer, text[:half]), im_end, 10**6, -1, *partial]
    generated += encode(smol_tokenizer, text[half:])
    params = SamplingParams(skip_special_tokens=skip)
    prompt = encode(smol_tokenizer, CHAT_PROMPT)
    one = IncrementalDetokenizer(smol_tokenizer, prompt, params)
    many = IncrementalDetokenizer(smol_tokenizer, prompt, params)
    assert one._texts is not None  # the lookup is on: byte-level, no stop strings
    deltas = [one.add_token(t) for t in generated]
    assert deltas == [many.add_tokens([t]) for t in generated]
    tail = one.finish()
    assert tail == many.finish() and "".join(deltas) + tail == one.text == many.text
    with pytest.raises(RuntimeError):
        one.add_token(generated[0])


def test_with_a_stop_string_one_token_takes_the_general_path(smol_tokenizer: Any) -> None:
    params = SamplingParams(stop=("lo w",))
    detok = IncrementalDetokenizer(smol_tokenizer, [], params)
    assert detok._texts is None
    deltas = [detok.add_token(t) for t in encode(smol_tokenizer, "Hello world")]
    assert "".join(deltas) + detok.finish() == "Hel" and detok.stop_string == "lo w"
