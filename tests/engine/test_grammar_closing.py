"""Budget-aware constrained decoding, alone (issue 20): the closing search over the real xgrammar
backend and SmolLM2's tokenizer, and the closer's schedule over a fake matcher."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
import xgrammar as xgr

from ops.bench.openai_structured import SCHEMAS
from producer.constraints import ChoiceConstraint, JsonSchemaConstraint, RegexConstraint
from worker.engine.budget_closer import FIRST_CHECK_TOKENS, MARGIN, STOPS, BudgetCloser
from worker.engine.grammar_closing import TextEncoder
from worker.engine.grammar_xgrammar import XGrammarBackend, XGrammarMatcher
from worker.models.loader import load_tokenizer

EOS = 2
BOOK = {
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 24}, "subtitle": {"type": "string"}},
    "required": ["title", "subtitle"],
}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def backend(tokenizer: Any) -> XGrammarBackend:
    return XGrammarBackend(tokenizer, len(tokenizer), [EOS])


def _after(backend: XGrammarBackend, structure: Any, text: str, tokenizer: Any) -> XGrammarMatcher:
    matcher = backend.compile(structure).matcher([EOS])
    assert all(matcher.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))
    return matcher


def _allowed(matcher: XGrammarMatcher, bitmask: torch.Tensor) -> list[int]:
    matcher.fill(bitmask, 0)
    bits = (bitmask[0].unsqueeze(1) >> torch.arange(32, dtype=torch.int32)) & 1  # (W, 32)
    return bits.flatten().nonzero().flatten().tolist()


def test_a_looping_string_closes_with_its_quote(backend: XGrammarBackend, tokenizer: Any) -> None:
    head = '{"title": "Dune", "subtitle": "book{id:11-0,author:LeylaLeylaLeyla'
    matcher = _after(backend, JsonSchemaConstraint(schema=BOOK), head, tokenizer)
    bitmask = backend.allocate_bitmask(1)
    before = _allowed(matcher, bitmask)
    path = matcher.closing(10)
    assert path is not None and tokenizer.decode(path) == '"}' and len(path) == 1
    assert _allowed(matcher, bitmask) == before  # the search left the matcher where it was
    assert all(matcher.accept(t) for t in path) and matcher.accept(EOS)
    assert matcher.closing(0) is None or matcher.is_terminated()


def test_required_fields_after_the_loop_are_filled_in(
    backend: XGrammarBackend, tokenizer: Any
) -> None:
    schema = {
        "type": "object",
        "properties": {
            "note": {"type": "string"},
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"enum": ["x", "yz"]}, "minItems": 2},
            "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{2}$"},
        },
        "required": ["note", "ok", "tags", "code"],
    }
    matcher = _after(backend, JsonSchemaConstraint(schema=schema), '{"note": "aaaa', tokenizer)
    path = matcher.closing(40)
    assert path is not None
    text = '{"note": "aaaa' + tokenizer.decode(path)
    jsonschema.validate(json.loads(text), schema)
    assert matcher.closing(len(path) - 1) is None  # not within fewer tokens than it found


@pytest.mark.parametrize(
    ("structure", "head", "ending"),
    [
        (RegexConstraint(pattern=r"[a-z]+@[a-z]+\.com"), "abc", r"@a.com"),
        (ChoiceConstraint(choices=("maybe not", "no")), "ma", "ybe not"),
        (RegexConstraint(pattern=r"(ab)+"), "abab", ""),
    ],
)
def test_regex_and_choice(
    backend: XGrammarBackend, tokenizer: Any, structure: Any, head: str, ending: str
) -> None:
    path = _after(backend, structure, head, tokenizer).closing(20)
    assert path is not None and tokenizer.decode(path) == ending


def test_no_path_within_the_limit(backend: XGrammarBackend, tokenizer: Any) -> None:
    matcher = backend.compile(RegexConstraint(pattern="x{50}")).matcher([EOS])
    assert matcher.closing(5) is None
    assert matcher.closing(60) is not None


def test_random_prefixes_of_the_bench_schemas_close_valid(
    backend: XGrammarBackend, tokenizer: Any
) -> None:
    # Three random walks per schema through the grammar's own masks (any allowed token), then
    # the closing path: prefix + path parses and validates (control characters the grammar
    # allows inside strings aside: strict=False). The module doc's numbers: 15 walks each.
    rng = random.Random(0)
    bitmask = backend.allocate_bitmask(1)
    for model in SCHEMAS:
        schema = model.model_json_schema()
        compiled = backend.compile(JsonSchemaConstraint(schema=schema))
        for _ in range(3):
            matcher, ids = compiled.matcher([EOS]), []
            for _ in range(rng.randrange(1, 60)):
                allowed = [t for t in _allowed(matcher, bitmask) if t != EOS]
                if not allowed:
                    break
                ids.append(rng.choice(allowed))
                assert matcher.accept(ids[-1])
            path = matcher.closing(60)
            assert path is not None, (model.__name__, tokenizer.decode(ids))
            assert len(path) <= 30
            jsonschema.validate(json.loads(tokenizer.decode(ids + path), strict=False), schema)


class FakeNeed:
    """A matcher that needs ``need`` tokens (all 7) to finish."""

    def __init__(self, need: int) -> None:
        self.need = need
        self.calls: list[int] = []

    def closing(self, limit: int) -> list[int] | None:
        self.calls.append(limit)
        return [7] * self.need if self.need <= limit else None


def _run(closer: BudgetCloser, matcher: FakeNeed, budget: int) -> list[int | None]:
    return [closer.decide(matcher, p, budget - p) for p in range(budget)]


def test_the_closer_is_free_until_the_slack_is_the_margin() -> None:
    matcher = FakeNeed(5)
    got = _run(BudgetCloser(), matcher, 200)
    assert got[: 200 - 8] == [None] * (200 - 8)  # budget 200 .. 9: free
    assert got[200 - 8 :] == [7] * 5 + [STOPS] * 3  # budget 8 = 5 + stop + MARGIN: closing
    assert MARGIN == 2 and len(matcher.calls) <= 10  # a few checks, none above the first one
    assert max(matcher.calls) <= FIRST_CHECK_TOKENS - 1


def test_decisions_are_made_once_per_position_and_replay_alike() -> None:
    closer, again = BudgetCloser(), BudgetCloser()
    first = _run(closer, FakeNeed(3), 40)
    assert [closer.decide(FakeNeed(3), 39, 1)] == first[39:]  # asked again: the same
    assert _run(again, FakeNeed(3), 40) == first


def test_a_resumed_token_off_the_path_plans_again() -> None:
    closer, matcher = BudgetCloser(), FakeNeed(3)
    decided = [closer.decide(matcher, p, 10 - p) for p in range(5)]
    assert decided[-1] == 7 and closer.closing
    closer.taken(9)  # another build's token
    assert not closer.closing
    assert closer.decide(matcher, 5, 5) == 7  # planned again at once


def test_a_structure_that_cannot_finish_is_left_alone() -> None:
    matcher = FakeNeed(500)
    assert _run(BudgetCloser(), matcher, 300) == [None] * 300
    assert len(matcher.calls) < 40  # failed searches wait: 4 tokens, or a quarter of the budget


def test_a_tokenizer_that_adds_a_prefix_space_falls_back_to_the_vocabulary(
    backend: XGrammarBackend, tokenizer: Any
) -> None:
    # SentencePiece encodes '"}' alone as '▁"}': its own ids never spell the text, so the
    # encoder matches the vocabulary's bytes, longest first.
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    spaced = TextEncoder(
        lambda text: tokenizer.encode(" " + text, add_special_tokens=False),
        info.decoded_vocab,
        {EOS},
    )
    ids = spaced('"}, "n": 0}')
    assert tokenizer.decode(ids) == '"}, "n": 0}'
    assert ids == tokenizer.encode('"}, "n": 0}', add_special_tokens=False)
    assert spaced("\x00") == [] or tokenizer.decode(spaced("\x00")) == "\x00"
