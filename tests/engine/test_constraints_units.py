"""The grammar backend and the compile cache alone (issue 20): masks, checks, errors, the LRU."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from producer.constraints import ChoiceConstraint, JsonSchemaConstraint, RegexConstraint
from producer.protocol import SamplingSpec
from worker.engine.engine_request import validate_request
from worker.engine.grammar import GrammarError, check_structure, structure_key
from worker.engine.grammar_compiles import GrammarCompiles
from worker.engine.grammar_xgrammar import XGrammarBackend
from worker.engine.sampling_params import InvalidSamplingParams, SamplingParams
from worker.models.loader import load_tokenizer

EOS = 2


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def backend(tokenizer: Any) -> XGrammarBackend:
    return XGrammarBackend(tokenizer, len(tokenizer), [EOS])


def _unpack(bitmask: torch.Tensor, row: int, vocab: int) -> set[int]:
    words = bitmask[row].tolist()
    return {t for t in range(vocab) if (words[t // 32] >> (t % 32)) & 1}


def test_the_bitmask_allows_exactly_what_the_matcher_accepts(
    backend: XGrammarBackend, tokenizer: Any
) -> None:
    vocab = backend.vocab_size
    compiled = backend.compile(ChoiceConstraint(choices=("yes", "no", "nope")))
    bitmask = backend.allocate_bitmask(3)
    compiled.matcher([EOS]).fill(bitmask, 1)
    mask = _unpack(bitmask, 1, vocab)
    texts = {t: tokenizer.decode([t]) for t in mask}
    assert mask and all("yes".startswith(s) or "nope".startswith(s) for s in texts.values())
    for token in sorted(mask)[:20] + [t for t in range(0, vocab, 997) if t not in mask]:
        assert compiled.matcher([EOS]).accept(token) == (token in mask), token
    logits = torch.zeros(3, vocab)
    backend.apply_bitmask(logits, bitmask, [1])
    assert set(torch.isfinite(logits[1]).nonzero().flatten().tolist()) == mask
    assert torch.equal(logits[0], torch.zeros(vocab))  # rows not named are left alone


def test_eos_is_allowed_only_once_the_grammar_is_complete(
    backend: XGrammarBackend, tokenizer: Any
) -> None:
    matcher = backend.compile(RegexConstraint(pattern="ab(cd)?")).matcher([EOS, 7])
    bitmask = backend.allocate_bitmask(1)
    seen = []
    for piece in ("a", "b", "c", "d"):
        matcher.fill(bitmask, 0)
        seen.append(EOS in _unpack(bitmask, 0, backend.vocab_size))
        (token,) = tokenizer.encode(piece, add_special_tokens=False)
        assert matcher.accept(token)
    matcher.fill(bitmask, 0)
    assert seen == [False, False, True, False]  # after "ab" it may end; after "abc" not
    assert _unpack(bitmask, 0, backend.vocab_size) == {EOS, 7}  # the stop tokens only
    assert matcher.accept(EOS) and matcher.is_terminated()


@pytest.mark.parametrize(
    ("structure", "message"),
    [
        ({"type": "json_schema", "schema": {"type": "object", "properties": 5}}, "properties"),
        ({"type": "regex", "pattern": "(?=x)y"}, "Lookahead is not supported"),
        ({"type": "grammar", "grammar": 'rot ::= "a"'}, 'root rule with name "root"'),
    ],
)
def test_a_constraint_that_does_not_parse_is_refused_at_admission(
    structure: dict[str, Any], message: str
) -> None:
    params = SamplingParams(structure=structure)  # type: ignore[arg-type]
    with pytest.raises(GrammarError) as info:
        validate_request([1, 2], params, max_model_len=64, vocab_size=100)
    text = str(info.value)
    assert text.startswith(f"invalid sampling parameter structure: {structure['type']}: ")
    assert message in text and ".cc:" not in text  # no C++ source positions
    assert isinstance(info.value, InvalidSamplingParams)  # the service's invalid_request


def test_logit_bias_ids_are_checked_against_the_vocabulary() -> None:
    with pytest.raises(InvalidSamplingParams, match=r"logit_bias: each token id must be in 0..99"):
        validate_request([1], SamplingParams(logit_bias={100: 1.0}), 64, 100)


def test_compiles_are_shared_by_content_and_bounded() -> None:
    built: list[int] = []
    gate = threading.Event()

    class Recording:
        def compile(self, structure: Any) -> Any:
            gate.wait(5)
            built.append(1)
            return structure_key(structure)

    compiles = GrammarCompiles(Recording, cache_size=2)  # type: ignore[arg-type]
    a, a_again = (JsonSchemaConstraint(schema={"type": "integer"}) for _ in range(2))
    first = compiles.submit(a)
    assert not first.done()  # compiling on its own thread: submit did not wait
    gate.set()
    assert compiles.submit(a_again) is first and first.result() == structure_key(a)
    compiles.submit(RegexConstraint(pattern="x")).result()
    compiles.submit(RegexConstraint(pattern="y")).result()  # a is the oldest: dropped
    assert len(built) == 3
    assert compiles.compiled(a) == structure_key(a) and len(built) == 4  # compiled again
    compiles.close()


def test_the_key_is_the_wire_form() -> None:
    spec = SamplingSpec.model_validate({"structure": {"type": "regex", "pattern": "a+"}})
    assert spec.structure is not None
    assert structure_key(spec.structure) == structure_key(RegexConstraint(pattern="a+"))
    assert structure_key(RegexConstraint(pattern="a+")) != structure_key(
        RegexConstraint(pattern="a*")
    )
    check_structure(RegexConstraint(pattern="a+"))  # parses: no error
