"""Budget-aware constrained decoding end to end on the tiny random model (issue 20).

The tiny tied model echoes its last token, so inside an unbounded JSON string it never writes
the closing quote: without budget-aware closing every such job ends ``length``, cut mid-string.
With it, the job ends ``stop`` with JSON that validates, inside ``max_tokens``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import jsonschema
import pytest

from producer.constraints import JsonSchemaConstraint
from tests.engine.test_constraints import PROMPTS, SCHEMA, make_engine, params
from worker.engine.budget_closer import BudgetCloser
from worker.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine.outputs import Completion

NOTE = {
    "type": "object",
    "properties": {"note": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["note", "n"],
}
LOOPING = JsonSchemaConstraint(schema=NOTE)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> LLMEngine:
    return make_engine(tiny_model_dir)


@pytest.fixture
def without_closing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Today's behaviour before budget-aware closing: the closer never steers."""
    monkeypatch.setattr(BudgetCloser, "decide", lambda self, matcher, position, budget: None)


def _valid_stops(engine: LLMEngine, outputs: Sequence[Completion], max_tokens: int) -> None:
    for c in outputs:
        assert c.finish_reason == "stop", c.text
        assert len(c.token_ids) <= max_tokens and c.token_ids[-1] in engine.eos_token_ids
        jsonschema.validate(json.loads(c.text), NOTE)


@pytest.mark.parametrize("max_tokens", [12, 20, 40])
def test_a_budget_the_loop_outruns_ends_stop_with_valid_json(
    engine: LLMEngine, max_tokens: int
) -> None:
    p = params(LOOPING, temperature=1.0, seed=3, max_tokens=max_tokens)
    _valid_stops(engine, engine.generate(PROMPTS, p), max_tokens)


def test_without_closing_the_same_jobs_are_cut(engine: LLMEngine, without_closing: None) -> None:
    p = params(LOOPING, temperature=1.0, seed=3, max_tokens=20)
    assert {c.finish_reason for c in engine.generate(PROMPTS, p)} == {"length"}


def test_an_ample_budget_draws_the_same_tokens(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # max_tokens 100: the closer checks from the first token (budget <= 128) and never steers;
    # n = 2 and a seed, so the draws are comparable.
    p = params(JsonSchemaConstraint(schema=SCHEMA), temperature=1.0, seed=4, n=2, max_tokens=100)
    got = [[c.token_ids for c in out.choices] for out in engine.generate(PROMPTS, p)]
    monkeypatch.setattr(BudgetCloser, "decide", lambda self, matcher, position, budget: None)
    assert got == [[c.token_ids for c in out.choices] for out in engine.generate(PROMPTS, p)]


def test_n_choices_and_seeds(engine: LLMEngine) -> None:
    p = params(LOOPING, temperature=1.0, seed=11, n=3, max_tokens=24)
    first, again = engine.generate(["Hi"], p)[0], engine.generate(["Hi"], p)[0]
    assert [c.token_ids for c in first.choices] == [c.token_ids for c in again.choices]
    _valid_stops(engine, first.choices, 24)


def test_the_model_length_binds_like_max_tokens(tiny_model_dir: Path) -> None:
    short = LLMEngine(
        EngineConfig(
            model=str(tiny_model_dir),
            cache=CacheConfig(block_size=4, num_blocks=64),
            scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=30),
            overlap_steps="off",
        )
    )
    p = params(LOOPING, temperature=1.0, seed=5, max_tokens=200)
    outs = short.generate(["Hi"], p)
    _valid_stops(short, outs, 30)
    assert outs[0].num_prompt_tokens + len(outs[0].token_ids) <= 30


def test_resume_inside_the_closing_path_replays_its_decisions(engine: LLMEngine) -> None:
    p = params(LOOPING, temperature=1.0, seed=2, max_tokens=20)
    (whole,) = engine.generate(["Hi"], p)
    head = whole.token_ids[:-3]  # past the switch: the last tokens are the path and EOS
    engine.add_prompt("resumed", "Hi", p, resume=(head,))
    rest = []
    while engine.has_unfinished():
        rest += [t for out in engine.step() for t in out.new_token_ids]
    assert (*head, *rest) == whole.token_ids


def test_min_tokens_pads_a_closed_output_with_stop_tokens(engine: LLMEngine) -> None:
    p = params(LOOPING, temperature=1.0, seed=3, max_tokens=20, min_tokens=20)
    (c,) = engine.generate(["Hi"], p)
    assert c.finish_reason == "stop" and len(c.token_ids) == 20
    jsonschema.validate(json.loads(c.text), NOTE)


def test_stop_strings_still_end_a_closing_job(engine: LLMEngine) -> None:
    p = params(LOOPING, temperature=1.0, seed=3, max_tokens=20, stop=("never seen",))
    _valid_stops(engine, engine.generate(["Hi"], p), 20)
    cut = params(LOOPING, temperature=1.0, seed=3, max_tokens=20, stop=('"n"',))
    (c,) = engine.generate(["Hi"], cut)  # the closing path writes the required key "n"
    assert c.finish_reason == "stop_string" and c.text.startswith('{"note": "')


class _Broken:
    def closing(self, limit: int) -> list[int] | None:
        raise RuntimeError("search bug")


def test_a_failing_search_leaves_the_row_as_before(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("worker.engine.grammar_xgrammar.XGrammarMatcher.closing", _Broken.closing)
    (c,) = engine.generate(["Hi"], params(LOOPING, temperature=1.0, seed=3, max_tokens=20))
    assert c.finish_reason == "length" and len(c.token_ids) == 20


@pytest.mark.slow  # two more engines, ~40 s on the shared 2-core machine
@pytest.mark.parametrize("overlap", ["off", "async"])
def test_preemption_and_the_overlapped_loop_close_alike(
    tiny_model_dir: Path, engine: LLMEngine, overlap: str
) -> None:
    # 24 blocks of 4 tokens for 4 sequences of up to 31 tokens (8 blocks) each: they preempt
    # each other and recompute, and each closes where it does with room.
    tight = LLMEngine(
        EngineConfig(
            model=str(tiny_model_dir),
            cache=CacheConfig(block_size=4, num_blocks=24),
            scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64),
            overlap_steps=overlap,  # type: ignore[arg-type]
        )
    )
    p = params(LOOPING, temperature=1.0, seed=6, max_tokens=28)
    roomy = [c.token_ids for c in engine.generate(PROMPTS, p)]
    got = tight.generate(PROMPTS, p)
    assert [c.token_ids for c in got] == roomy
    _valid_stops(tight, got, 28)
