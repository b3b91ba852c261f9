from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.engine.detokenizer import IncrementalDetokenizer
from worker.engine.sampling_params import SamplingParams

IM_END = 2  # <|im_end|>, a special token of the smol tokenizer
CHAT_PROMPT = "<|im_start|>user\nSay something<|im_end|>\n<|im_start|>assistant\n"
TEXTS = [
    "Hello world",
    "  two leading spaces, then  double   and triple spaces ",
    "tabs\tand\t\tnewlines\n\n  indented\n\t mixed \r\n",
    "emoji 😀👍🏽 and family \U0001f468\u200d\U0001f469\u200d\U0001f467 flags 🇫🇷🇯🇵",
    "中文文本，日本語のテキスト、한국어 텍스트",
    "😀😀😀中文😀 x😀\n😀",
    "math ∑∫√ and accents éàüñ ß Ωμ",
    " ",
    "\n",
]
FFFD = "\ufffd"


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def stream(
    tokenizer: Any,
    prompt: Sequence[int],
    generated: Sequence[int],
    params: SamplingParams | None = None,
    chunk: int = 1,
) -> tuple[list[str], IncrementalDetokenizer]:
    """Feed ``generated`` ``chunk`` tokens at a time, as the engine does; finish() last."""
    detok = IncrementalDetokenizer(tokenizer, prompt, params or SamplingParams())
    deltas = []
    for i in range(0, len(generated), chunk):
        deltas.append(detok.add_tokens(generated[i : i + chunk]))
        if detok.stop_string is not None:
            break
    deltas.append(detok.finish())
    return deltas, detok


def truncate_at_stop(text: str, stops: Sequence[str], include: bool) -> str:
    """Reference: cut at the stop string that completes first."""
    ends = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
    if not ends:
        return text
    end, start = min(ends)
    return text[: end if include else start]


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1000])
@pytest.mark.parametrize("text", TEXTS)
def test_deltas_concatenate_to_decode_without_replacement_chars(
    smol_tokenizer: Any, text: str, chunk: int
) -> None:
    prompt = encode(smol_tokenizer, CHAT_PROMPT)
    generated = encode(smol_tokenizer, text)
    deltas, detok = stream(smol_tokenizer, prompt, generated, chunk=chunk)
    expected = smol_tokenizer.decode(generated, skip_special_tokens=True)
    assert expected == text  # byte-level BPE round-trips exactly
    assert "".join(deltas) == detok.text == expected
    assert not any(FFFD in d for d in deltas)
    assert detok.stop_string is None


def test_split_emoji_is_held_back_until_complete(smol_tokenizer: Any) -> None:
    generated = encode(smol_tokenizer, "a😀")
    assert len(generated) == 4  # "a" + the emoji's four bytes in three tokens
    detok = IncrementalDetokenizer(smol_tokenizer, [], SamplingParams())
    assert [detok.add_tokens([t]) for t in generated] == ["a", "", "", "😀"]
    assert detok.finish() == ""


def test_invalid_utf8_comes_out_as_the_tokenizer_decodes_it(smol_tokenizer: Any) -> None:
    partial = encode(smol_tokenizer, "😀")[:2]  # three of the four bytes
    for generated in (partial, partial + encode(smol_tokenizer, "ok"), partial + partial):
        deltas, _ = stream(smol_tokenizer, [], generated)
        assert "".join(deltas) == smol_tokenizer.decode(generated)
        assert FFFD in "".join(deltas)
    deltas, _ = stream(smol_tokenizer, [], partial)
    assert deltas[:-1] == ["", ""]  # held back until finish()


@pytest.mark.parametrize("skip", [True, False])
def test_skip_special_tokens_both_ways(smol_tokenizer: Any, skip: bool) -> None:
    generated = [*encode(smol_tokenizer, "Hi there"), IM_END, *encode(smol_tokenizer, " more")]
    generated.append(IM_END)
    deltas, _ = stream(smol_tokenizer, [1], generated, SamplingParams(skip_special_tokens=skip))
    expected = "Hi there<|im_end|> more<|im_end|>" if not skip else "Hi there more"
    assert "".join(deltas) == expected == smol_tokenizer.decode(generated, skip_special_tokens=skip)


@pytest.mark.parametrize("chunk", [1, 2, 5])
@pytest.mark.parametrize(
    ("stops", "include", "expected"),
    [
        (("world",), False, "Hello, "),
        (("world",), True, "Hello, world"),
        (("lo, wo",), False, "Hel"),  # spans the "Hello" | "," | " world" token boundaries
        (("Hel",), False, ""),  # at the very start
        (("Hel",), True, "Hel"),
        (("you", "how", "zzz"), False, "Hello, world! "),  # "how" completes before "you"
        (("are you", "re"), True, "Hello, world! how are"),  # "re" completes first
        (("you?",), True, "Hello, world! how are you?"),  # at the very end
        (("absent", "orld!x"), False, "Hello, world! how are you?"),
    ],
)
def test_stop_strings(
    smol_tokenizer: Any, stops: tuple[str, ...], include: bool, expected: str, chunk: int
) -> None:
    text = "Hello, world! how are you?"
    params = SamplingParams(stop=stops, include_stop_str_in_output=include)
    deltas, detok = stream(smol_tokenizer, [], encode(smol_tokenizer, text), params, chunk)
    assert "".join(deltas) == detok.text == expected == truncate_at_stop(text, stops, include)
    assert (detok.stop_string is not None) == (expected != text or (include and text.endswith("?")))


def test_partial_stop_string_is_held_back_then_flushed(smol_tokenizer: Any) -> None:
    detok = IncrementalDetokenizer(smol_tokenizer, [], SamplingParams(stop=("world",)))
    deltas = [detok.add_tokens([t]) for t in encode(smol_tokenizer, "Hello wor")]
    assert "".join(deltas) == "Hello"  # the last len("world") - 1 chars are held back
    assert detok.text == "Hello wor"
    assert detok.finish() == " wor"
    assert detok.stop_string is None


def test_no_tokens_after_a_stop_string(smol_tokenizer: Any) -> None:
    detok = IncrementalDetokenizer(smol_tokenizer, [], SamplingParams(stop=("b",)))
    assert detok.add_tokens(encode(smol_tokenizer, "a b c")) == "a "
    assert detok.stop_string == "b"
    with pytest.raises(RuntimeError):
        detok.add_tokens(encode(smol_tokenizer, "d"))
    assert detok.finish() == ""
    assert detok.text == "a "


FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # three emoji joined by ZWJ
ALPHABET = st.sampled_from([*"ab c\t\n  xyz.,!?é中文語😀👍🏽\u200d한", FAMILY, "  ", "\r\n"])
# Up to three stop strings, each a slice (start, length) of the generated text.
STOP_SLICES = st.lists(st.tuples(st.integers(0, 60), st.integers(1, 4)), max_size=3)


def stops_of(text: str, stop_slices: list[tuple[int, int]]) -> tuple[str, ...]:
    """The distinct non-empty slices of ``text``: stop strings that may occur in it."""
    return tuple(dict.fromkeys(s for a, n in stop_slices if (s := text[a : a + n])))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    pieces=st.lists(ALPHABET, max_size=40),
    chunk=st.integers(1, 6),
    stop_slices=STOP_SLICES,
    include=st.booleans(),
)
def test_concatenation_invariant_on_random_text(
    smol_tokenizer: Any,
    pieces: list[str],
    chunk: int,
    stop_slices: list[tuple[int, int]],
    include: bool,
) -> None:
    text = "".join(pieces)
    stops = stops_of(text, stop_slices)
    generated = encode(smol_tokenizer, text)
    params = SamplingParams(stop=stops, include_stop_str_in_output=include)
    deltas, detok = stream(smol_tokenizer, encode(smol_tokenizer, "Q: "), generated, params, chunk)
    assert "".join(deltas) == detok.text == truncate_at_stop(text, stops, include)
    assert not any(FFFD in d for d in deltas)


# -- SentencePiece-style: "▁" word starts, byte fallback, one leading space stripped on decode --


@pytest.fixture(scope="module")
def sp_tokenizer() -> Any:
    """A tiny Llama-2-like tokenizer trained here in ~10 ms: no emoji in its corpus, so emoji
    come out as <0xNN> byte tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [
        "Hello world, this is a tiny corpus.",
        "The quick brown fox jumps over the lazy dog.",
        "  Leading spaces\tand tabs\nand newlines.",
        "中文 文本 测试",
    ] * 3
    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    tok.train_from_iterator(corpus, trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = dict(model["vocab"])
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    merges = [tuple(m) for m in model["merges"]]
    tok.model = models.BPE(vocab=vocab, merges=merges, byte_fallback=True)
    # Llama 2's decoder: "▁" to space, bytes to text, then strip one leading space.
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def sp_expected(tokenizer: Any, generated: list[int]) -> str:
    """decode(generated), plus the leading space decode strips when a prompt precedes it."""
    text = tokenizer.decode(generated)
    first = tokenizer.convert_ids_to_tokens(generated[:1])
    return " " + text if first and first[0].startswith("▁") else text


@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("text", TEXTS)
def test_sentencepiece_keeps_the_first_tokens_space(
    sp_tokenizer: Any, text: str, chunk: int
) -> None:
    prompt = [1, *encode(sp_tokenizer, "Hello")]
    generated = encode(sp_tokenizer, text)
    deltas, detok = stream(sp_tokenizer, prompt, generated, chunk=chunk)
    assert "".join(deltas) == detok.text == sp_expected(sp_tokenizer, generated)
    assert not any(FFFD in d for d in deltas)
    # Without a prompt there is nothing to keep the space for: plain decode.
    deltas, _ = stream(sp_tokenizer, [], generated, chunk=chunk)
    assert "".join(deltas) == sp_tokenizer.decode(generated)


def test_sentencepiece_word_by_word(sp_tokenizer: Any) -> None:
    generated = encode(sp_tokenizer, "world 😀 中文")
    assert "<0xF0>" in sp_tokenizer.convert_ids_to_tokens(generated)
    detok = IncrementalDetokenizer(sp_tokenizer, encode(sp_tokenizer, "Hello"), SamplingParams())
    deltas = [detok.add_tokens([t]) for t in generated]
    assert "".join(deltas) == " world 😀 中文"
    assert "😀" in deltas and deltas.count("") == 3  # the emoji's first three bytes held back


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(pieces=st.lists(ALPHABET, max_size=30), chunk=st.integers(1, 4))
def test_sentencepiece_invariant_on_random_text(
    sp_tokenizer: Any, pieces: list[str], chunk: int
) -> None:
    generated = encode(sp_tokenizer, "".join(pieces))
    deltas, _ = stream(sp_tokenizer, encode(sp_tokenizer, "Hi"), generated, chunk=chunk)
    assert "".join(deltas) == sp_expected(sp_tokenizer, generated)
    assert not any(FFFD in d for d in deltas)
