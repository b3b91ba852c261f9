"""Constrained decoding end to end on the tiny random model (issue 20).

The model's weights are random: whatever it prefers, the constraint decides what may come, so
every finished output must match. Schemas here are bounded (enums, booleans, small integer
ranges, few items) so a random model ends them well within ``max_tokens``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from producer.constraints import ChoiceConstraint, JsonSchemaConstraint, RegexConstraint
from worker.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from worker.engine.constraint_gate import ConstraintGate
from worker.engine.grammar_compiles import GrammarCompiles
from worker.engine.llm_engine import LLMEngine
from worker.engine.sampling_params import SamplingParams
from worker.engine.wait_reasons import WaitReason

SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 3},
    },
    "required": ["color", "ok", "n", "tags"],
    "additionalProperties": False,
}
PROMPTS = ["Hello", "Give me JSON:", "The quick brown fox", "1 2 3"]


def make_engine(model_dir: Path, num_blocks: int = 512, seqs: int = 8) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            cache=CacheConfig(block_size=4, num_blocks=num_blocks),
            scheduler=SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=64),
            overlap_steps="off",
        )
    )


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> LLMEngine:
    return make_engine(tiny_model_dir)


def params(structure: object, **fields: object) -> SamplingParams:
    return SamplingParams(structure=structure, **{"max_tokens": 120, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_outputs_parse_and_validate(engine: LLMEngine, temperature: float) -> None:
    p = params({"type": "json_schema", "schema": SCHEMA}, temperature=temperature, seed=3)
    for c in engine.generate(PROMPTS, p):
        assert c.finish_reason == "stop", c.text
        jsonschema.validate(json.loads(c.text), SCHEMA)


def test_choice_and_regex(engine: LLMEngine) -> None:
    choices = ["yes", "no", "maybe not", "中文 ok"]
    got = engine.generate(PROMPTS, params(ChoiceConstraint(choices=tuple(choices))))
    assert all(c.text in choices and c.finish_reason == "stop" for c in got)
    pattern = r"[A-Z][a-z]{1,3}-[0-9]{2}"
    random = params(RegexConstraint(pattern=pattern), temperature=1.0, seed=1)
    assert all(re.fullmatch(pattern, c.text) for c in engine.generate(PROMPTS, random))


def test_eos_only_where_the_grammar_is_complete(engine: LLMEngine) -> None:
    # "ab" or "abab...": the grammar may end after each "ab", and only there. The tiny tied
    # model echoes its last token, so without the mask it would not stop at all.
    grammar = {"type": "grammar", "grammar": 'root ::= ("a" "b")+'}
    for c in engine.generate(PROMPTS, params(grammar, temperature=1.0, seed=7, max_tokens=40)):
        assert re.fullmatch("(ab)+", c.text) or c.finish_reason == "length", c.text
        if c.finish_reason == "stop":
            assert c.token_ids[-1] in engine.eos_token_ids


def test_max_tokens_cuts_a_constrained_output_with_length(engine: LLMEngine) -> None:
    p = params({"type": "regex", "pattern": "x{50}"}, max_tokens=5)
    (c,) = engine.generate(["Hi"], p)
    assert c.finish_reason == "length" and len(c.token_ids) == 5 and set(c.text) == {"x"}


def test_n_choices_seeds_and_stop_strings(engine: LLMEngine) -> None:
    schema = JsonSchemaConstraint(schema=SCHEMA)
    p = params(schema, temperature=1.0, seed=11, n=3)
    first, again = engine.generate(["Hi"], p)[0], engine.generate(["Hi"], p)[0]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]  # seeded
    for c in first.choices:
        jsonschema.validate(json.loads(c.text), SCHEMA)
    cut = params(schema, temperature=0.0, stop=(",",))
    (c,) = engine.generate(["Hi"], cut)
    assert c.finish_reason == "stop_string" and re.sub(r"\s", "", c.text).startswith('{"color":')


@pytest.mark.slow  # ~30 s on the shared 2-core machine
def test_preemption_keeps_each_matcher(tiny_model_dir: Path, engine: LLMEngine) -> None:
    # 24 blocks of 4 tokens for 4 sequences that want ~30 tokens each: they preempt each other
    # and recompute, and each constrained output still validates.
    tight = make_engine(tiny_model_dir, num_blocks=24, seqs=4)
    p = params({"type": "json_schema", "schema": SCHEMA}, temperature=1.0, seed=5)
    preempted = 0
    for i, prompt in enumerate(PROMPTS):
        tight.add_prompt(f"r{i}", prompt, p)
    outs: dict[str, str] = {f"r{i}": "" for i in range(len(PROMPTS))}
    while tight.has_unfinished():
        for out in tight.step():
            outs[out.request_id] += out.text_delta
        preempted += len(tight.last_preempted)
    assert preempted > 0
    for text in outs.values():
        jsonschema.validate(json.loads(text), SCHEMA)
    roomy = [c.token_ids for c in engine.generate(PROMPTS, p)]
    assert [c.token_ids for c in tight.generate(PROMPTS, p)] == roomy  # seeded: preemption-proof


@pytest.mark.slow  # two engines
@pytest.mark.parametrize("mode", ["async", "thread"])
def test_the_overlapped_loops_draw_what_the_plain_loop_draws(
    tiny_model_dir: Path, engine: LLMEngine, mode: str
) -> None:
    # Constraint, penalty, n = 2 and preemption (24 blocks) at once: the state that follows the
    # tokens is brought up to date before each launch, whichever loop launches it.
    overlapped = LLMEngine(
        EngineConfig(
            model=str(tiny_model_dir),
            cache=CacheConfig(block_size=4, num_blocks=24),
            scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64),
            overlap_steps=mode,  # type: ignore[arg-type]
        )
    )
    p = params(
        {"type": "json_schema", "schema": SCHEMA},
        temperature=1.0,
        seed=3,
        n=2,
        frequency_penalty=0.5,
    )
    got = [[c.token_ids for c in out.choices] for out in overlapped.generate(PROMPTS, p)]
    assert got == [[c.token_ids for c in out.choices] for out in engine.generate(PROMPTS, p)]


def test_resume_replays_the_published_tokens(engine: LLMEngine) -> None:
    p = params({"type": "json_schema", "schema": SCHEMA}, temperature=1.0, seed=2)
    (whole,) = engine.generate(["Hi"], p)
    head = whole.token_ids[:4]
    engine.add_prompt("resumed", "Hi", p, resume=(head,))
    rest = []
    while engine.has_unfinished():
        rest += [t for out in engine.step() for t in out.new_token_ids]
    assert (*head, *rest) == whole.token_ids  # same seeded draws, the matcher where it was


def test_a_request_waits_while_its_grammar_compiles(engine: LLMEngine) -> None:
    pattern = "[0-9]{3}-[a-z]{2}"  # a pattern no other test compiles
    engine.add_prompt("waits", "Hi", params(RegexConstraint(pattern=pattern)))
    info = engine.wait_info().get("waits")
    if info is not None:  # the compile may have finished already: then it is queued
        assert info.reason is WaitReason.COMPILING_GRAMMAR
    text = ""
    while engine.has_unfinished():
        text += "".join(out.text_delta for out in engine.step())
    assert re.fullmatch(pattern, text)


def test_abort_while_compiling_reports_the_abort(engine: LLMEngine) -> None:
    engine.add_prompt("gone", "Hi", params(RegexConstraint(pattern="[a-f]{7}z")))
    assert engine.abort("gone")
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert [o.finish_reason for o in outs if o.request_id == "gone"] == ["abort"]


class _FailingBackend:
    """Parses what xgrammar parses, then fails every compile (what a backend bug looks like)."""

    def compile(self, structure: object) -> object:
        raise RuntimeError("out of grammar memory")


def test_a_failed_compile_ends_its_request_and_the_engine_steps_on(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = ConstraintGate(GrammarCompiles(_FailingBackend))  # type: ignore[arg-type]
    monkeypatch.setattr(engine, "_constraints", gate)
    engine.add_prompt("doomed", "Hi", params(RegexConstraint(pattern="[0-9]+"), n=2))
    engine.add_prompt("plain", "Hi", SamplingParams(max_tokens=3, ignore_eos=True))
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    doomed = [o for o in outs if o.request_id == "doomed"]
    assert [(o.index, o.finish_reason) for o in doomed] == [(0, "error"), (1, "error")]
    assert doomed[0].error == "out of grammar memory"
    assert sum(len(o.new_token_ids) for o in outs if o.request_id == "plain") == 3


def test_resumed_tokens_the_grammar_refuses_fail_that_request_only(engine: LLMEngine) -> None:
    yes = engine.encode("yes")
    engine.add_prompt("bad", "Hi", params(ChoiceConstraint(choices=("no",))), resume=(yes,))
    engine.add_prompt("good", "Hi", params(ChoiceConstraint(choices=("no",))))
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    bad = [o for o in outs if o.request_id == "bad"]
    assert bad[-1].finish_reason == "error" and "breaks the structure" in (bad[-1].error or "")
    assert "".join(o.text_delta for o in outs if o.request_id == "good") == "no"


def test_min_tokens_yields_to_a_grammar_that_has_ended(engine: LLMEngine) -> None:
    # The grammar allows only EOS after "a"; min_tokens cannot hold it off (an all -inf row).
    p = params(ChoiceConstraint(choices=("a",)), min_tokens=4, temperature=1.0, seed=0)
    (c,) = engine.generate(["Hi"], p)
    assert c.text == "a" and c.finish_reason == "stop"
    assert len(c.token_ids) == 4 and set(c.token_ids[1:]) <= engine.eos_token_ids
