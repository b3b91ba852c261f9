"""The overlapped loop (one step in flight, worker/engine/overlap.py) against the plain loop.

The tests' tiny model ties its embeddings and mostly echoes its last token, so equal greedy tokens
would prove little; this module's model has its own output projection, so greedy outputs vary
(asserted), and seeded sampled choices vary by construction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import write_tiny_llama
from tests.engine.test_step_faults import (
    free_when_idle,
    run_all,
    test_a_detokenizer_failure_fails_only_its_request,
    test_a_runner_failure_of_one_request_fails_only_that_request,
    test_a_sampling_failure_of_one_row_fails_only_its_request,
    tokens,
)
from worker.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from worker.engine.fair_share import OUTPUT_TOKEN_COST
from worker.engine.llm_engine import LLMEngine
from worker.engine.sampling_params import SamplingParams

MODES = ("async", "thread")
PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog " * 3,
    "One two three",
    "In a hole in the ground there lived a hobbit.",
    "a",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit",
]
Result = dict[tuple[str, int], tuple[list[int], str, str | None, list[Any]]]

# These run here once per overlapped mode, on this module's `engine` fixture.
__all__ = [
    "test_a_detokenizer_failure_fails_only_its_request",
    "test_a_runner_failure_of_one_request_fails_only_that_request",
    "test_a_sampling_failure_of_one_row_fails_only_its_request",
]


@pytest.fixture(scope="module")
def varied_model_dir(tmp_path_factory: pytest.TempPathFactory, smol_model_dir: Path) -> Path:
    """The tiny model with an untied output projection: its greedy tokens vary."""
    return write_tiny_llama(tmp_path_factory.mktemp("varied"), smol_model_dir, tie=False, seed=1)


def make(model_dir: Path, mode: str, num_blocks: int = 512) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            overlap_steps=mode,  # type: ignore[arg-type]
            cache=CacheConfig(block_size=4, num_blocks=num_blocks),
            scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64),
        )
    )


@pytest.fixture(scope="module", params=MODES)
def engine(request: pytest.FixtureRequest, tiny_model_dir: Path) -> LLMEngine:
    """The overlapped engine the imported `test_step_faults` tests run on."""
    return make(tiny_model_dir, request.param)


def run_mix(
    engine: LLMEngine, plan: list[tuple[str, str, SamplingParams]], cancel_after: dict[str, int]
) -> Result:
    """Every request of ``plan`` to its end; ``cancel_after[rid]``: abort once it has streamed
    that many tokens."""
    for rid, prompt, params in plan:
        add(engine, rid, prompt, params)
    got: Result = {}
    for _ in range(2000):
        if not engine.has_unfinished():
            return got
        for out in engine.step():
            toks, text, _, lps = got.setdefault((out.request_id, out.index), ([], "", None, []))
            toks += out.new_token_ids
            lps += [(lp.token_id, round(lp.logprob, 4), lp.rank, lp.top) for lp in out.logprobs]
            got[(out.request_id, out.index)] = (toks, text + out.text_delta, out.finish_reason, lps)
        for rid, k in cancel_after.items():
            if len(got.get((rid, 0), ([],))[0]) >= k:
                engine.abort(rid)
    raise AssertionError("the engine did not finish")


def add(engine: LLMEngine, rid: str, prompt: str, params: SamplingParams) -> None:
    """``add_prompt`` where requests are ``EngineRequest`` values (issue 18), else the older
    ``add_request`` of a prompt."""
    adder: Any = getattr(engine, "add_prompt", engine.add_request)
    adder(rid, prompt, params)


def greedy(max_tokens: int, **kw: Any) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def the_plan(reference: Result) -> list[tuple[str, str, SamplingParams]]:
    """A mix whose stop token and stop string occur mid-stream (read off a run without them)."""
    stop_token = reference[("p0", 0)][0][5]
    stop_text = reference[("p3", 0)][1][6:9]
    seeded = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=14, n=2, seed=11)
    return [
        ("stop-id", PROMPTS[0], greedy(20, stop_token_ids=(stop_token,), min_tokens=2)),
        ("long", PROMPTS[1], greedy(18, logprobs=2)),
        ("cancel", PROMPTS[2], greedy(20)),
        ("stop-str", PROMPTS[3], greedy(20, stop=(stop_text,))),
        ("seeded", PROMPTS[4], seeded),
        ("plain", PROMPTS[5], greedy(16)),
        ("sampled", PROMPTS[2], SamplingParams(temperature=1.0, max_tokens=12, seed=3)),
    ]


def test_the_overlapped_loop_gives_the_plain_loops_outputs(varied_model_dir: Path) -> None:
    reference = run_mix(
        make(varied_model_dir, "off"),
        [(f"p{i}", p, greedy(20)) for i, p in enumerate(PROMPTS)],
        {},
    )
    assert all(len(set(toks)) >= 4 for toks, *_ in reference.values())  # greedy tokens vary
    plan = the_plan(reference)
    results = {}
    preemptions = {}
    books = {}
    for mode in ("off", *MODES):
        engine = make(varied_model_dir, mode, num_blocks=24)  # 96 tokens: preempts
        results[mode] = run_mix(engine, plan, {"cancel": 4})
        preemptions[mode] = engine.scheduler.num_preemptions
        # Beyond the outputs: prompt tokens computed (recomputation after preemption too) and
        # the prefix cache's counters.
        books[mode] = (engine.scheduler.num_prompt_tokens_computed, engine.cache_stats())
        free_when_idle(engine)
    plain = results["off"]
    assert all(preemptions.values()), preemptions
    assert books["off"][0] > sum(len(engine.encode(p)) for _, p, _ in plan)  # some recomputed
    assert plain[("stop-id", 0)][2] == "stop" and plain[("stop-str", 0)][2] == "stop_string"
    assert plain[("cancel", 0)][2] == "abort" and len(plain[("cancel", 0)][0]) == 4
    assert plain[("seeded", 0)][0] != plain[("seeded", 1)][0]
    assert len(plain[("long", 0)][3]) == 18
    for mode in MODES:
        assert results[mode] == plain, mode
        assert books[mode] == books["off"], mode


@pytest.mark.parametrize("mode", MODES)
def test_no_token_after_a_stop_string_is_kept(varied_model_dir: Path, mode: str) -> None:
    reference = run_mix(make(varied_model_dir, "off"), [("r", PROMPTS[3], greedy(20))], {})
    stop = reference[("r", 0)][1][6:9]
    engine = make(varied_model_dir, mode)
    add(engine, "r", PROMPTS[3], greedy(20, stop=(stop,)))
    (state,) = engine._requests["r"]
    outs = run_all(engine)["r"]
    assert outs[-1].finish_reason == "stop_string"
    assert state.seq.output_token_ids == tokens(outs)  # the token computed in flight is dropped


def test_the_default_overlaps_on_cuda_and_the_flag_says_so() -> None:
    import argparse

    import torch

    from worker.engine.overlap import DEFAULT_MODES, overlap_mode

    assert overlap_mode(EngineConfig(), torch.device("cuda")) == DEFAULT_MODES["cuda"] == "async"
    assert overlap_mode(EngineConfig(overlap_steps="off"), torch.device("cuda")) == "off"
    parser = argparse.ArgumentParser()
    EngineConfig.add_arguments(parser)
    args = parser.parse_args(["--overlap-steps", "thread"])
    assert EngineConfig.from_args(args).overlap_steps == "thread"


@pytest.mark.parametrize("mode", MODES)
def test_tenants_are_charged_what_the_plain_loop_charges(tiny_model_dir: Path, mode: str) -> None:
    # The overlapped loop holds a token's place before the step is applied: each output token
    # must still be charged to its tenant, once (fair share orders the wait queue by it).
    charged = {}
    for loop in ("off", mode):
        e = make(tiny_model_dir, loop)
        e.add_prompt("a", "Hello there", greedy(7), tenant="ta")
        e.add_prompt("b", "One two three four", greedy(5), tenant="tb")
        e.add_prompt("c", "a", greedy(3, n=2), tenant="ta")
        for _ in range(200):
            if not e.has_unfinished():
                break
            e.step()
        assert not e.has_unfinished()
        fs = e.scheduler.fair_share
        charged[loop] = (fs.counter("ta"), fs.counter("tb"))
    assert charged[mode] == charged["off"]
    ta, tb = charged["off"]  # prompt tokens too, at their own cost (default weights: 1)
    assert ta > OUTPUT_TOKEN_COST * (7 + 2 * 3) and tb > OUTPUT_TOKEN_COST * 5
