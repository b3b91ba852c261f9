"""Prefix caching and n choices end to end on the tiny random model."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from worker.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine.outputs import RequestOutput
from worker.engine.sampling_params import InvalidSamplingParams, SamplingParams

BLOCK = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
PROMPT = "In a hole in the ground there lived a hobbit."


def make_engine(
    model_dir: Path, caching: bool, num_blocks: int = 512, budget: int = 32, seqs: int = 8
) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            cache=CacheConfig(
                block_size=BLOCK, num_blocks=num_blocks, enable_prefix_caching=caching
            ),
            scheduler=SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=budget),
        )
    )


@pytest.fixture(scope="module")
def cached(tiny_model_dir: Path) -> LLMEngine:
    return make_engine(tiny_model_dir, caching=True)


@pytest.fixture(scope="module")
def uncached(tiny_model_dir: Path) -> LLMEngine:
    return make_engine(tiny_model_dir, caching=False)


def run(
    engine: LLMEngine, prompts: dict[str, list[int]], params: SamplingParams = GREEDY
) -> dict[str, list[int]]:
    """All prompts in one continuous batch; each request's tokens."""
    for rid, ids in prompts.items():
        engine.add_prompt(rid, params=params, prompt_token_ids=ids)
    tokens: dict[str, list[int]] = {rid: [] for rid in prompts}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
    return tokens


def shared_prefix_prompts(seed: int) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """A first wave (one request per prefix) and a second that shares those prefixes."""
    rng = random.Random(seed)
    base = [rng.randrange(3, 49000) for _ in range(3 * BLOCK + 2)]
    first, second = {}, {}
    # Shorter than a block, exactly 1 and 3 blocks, 2 blocks plus 1 or 3 tokens.
    for length in (3, BLOCK, 2 * BLOCK + 1, 2 * BLOCK + 3, 3 * BLOCK):
        first[f"w1-{length}"] = base[:length]
        second[f"w2-{length}-same"] = base[:length]  # the whole prompt is cached
        for k in (1, 5):
            second[f"w2-{length}-{k}"] = base[:length] + [rng.randrange(3, 49000)] * k
    return first, second


def test_greedy_outputs_are_the_same_with_and_without_the_cache(
    cached: LLMEngine, uncached: LLMEngine
) -> None:
    first, second = shared_prefix_prompts(seed=1)
    hits_before = cached.cache_stats().num_hit_tokens
    computed_before = cached.scheduler.num_prompt_tokens_computed
    got = run(cached, first) | run(cached, second)
    computed = cached.scheduler.num_prompt_tokens_computed - computed_before
    expected = run(uncached, first) | run(uncached, second)
    assert got == expected
    hits = cached.cache_stats().num_hit_tokens - hits_before
    assert hits > 0
    assert computed + hits == sum(len(p) for p in (first | second).values())
    bm = cached.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    bm.assert_invariants([])


def test_request_outputs_report_cached_prompt_tokens(cached: LLMEngine) -> None:
    ids = cached.encode(PROMPT + " Not a nasty, dirty, wet hole.")
    run(cached, {"warm": ids})
    cached.add_prompt("again", params=GREEDY, prompt_token_ids=[*ids, 42])
    outs: list[RequestOutput] = []
    while cached.has_unfinished():
        outs += cached.step()
    assert {o.num_cached_tokens for o in outs} == {len(ids) // BLOCK * BLOCK}


def test_salted_requests_do_not_share(cached: LLMEngine) -> None:
    ids = cached.encode("Salted prefix that is long enough to fill a few blocks")
    before = cached.cache_stats().num_hit_tokens
    for i, salt in enumerate(["tenant-a", "tenant-b", None]):
        cached.add_prompt(f"salt-{i}", params=GREEDY, prompt_token_ids=ids, cache_salt=salt)
        while cached.has_unfinished():
            cached.step()
    assert cached.cache_stats().num_hit_tokens == before
    cached.add_prompt("salt-again", params=GREEDY, prompt_token_ids=ids, cache_salt="tenant-b")
    while cached.has_unfinished():
        cached.step()
    assert cached.cache_stats().num_hit_tokens > before


def test_preempted_sequences_recompute_from_the_cache(
    tiny_model_dir: Path, uncached: LLMEngine
) -> None:
    rng = random.Random(2)
    prompts = {f"p{i}": [rng.randrange(3, 49000) for _ in range(9)] for i in range(2)}
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    # 8 blocks of 4 hold 32 tokens; the two requests grow to 21 each, so the second is preempted
    # and comes back when the first finishes, with some of its blocks still cached.
    tight = make_engine(tiny_model_dir, caching=True, num_blocks=8, budget=8, seqs=4)
    got = run(tight, prompts, params)
    assert tight.scheduler.num_preemptions == 1
    # Random prompts share nothing: every hit is the preempted sequence finding its own blocks.
    assert tight.cache_stats().num_hit_tokens > 0
    assert got == run(uncached, prompts, params)


def test_n_greedy_choices_equal_the_single_choice_and_share_the_prompt(
    cached: LLMEngine, uncached: LLMEngine
) -> None:
    ids = cached.encode(PROMPT)
    single = cached.generate([PROMPT], GREEDY)[0]
    before = cached.scheduler.num_prompt_tokens_computed
    three = cached.generate([PROMPT], replace(GREEDY, n=3))[0]
    assert [c.token_ids for c in three.choices] == [single.token_ids] * 3
    assert [c.index for c in three.choices] == [0, 1, 2] and three.token_ids == single.token_ids
    # The first choice hits the blocks `single` left; the other two hit the same full blocks and
    # compute only the tail of the prompt.
    tail = len(ids) - (len(ids) - 1) // BLOCK * BLOCK
    assert cached.scheduler.num_prompt_tokens_computed - before == 3 * tail
    plain = uncached.generate([PROMPT], replace(GREEDY, n=3))[0]
    assert [c.token_ids for c in plain.choices] == [single.token_ids] * 3


def test_seeded_choices_are_reproducible_and_differ(cached: LLMEngine, uncached: LLMEngine) -> None:
    # The tiny model's logits are sharp: at temperature 1 most draws are its argmax.
    params = SamplingParams(temperature=3.0, seed=7, n=4, max_tokens=12, ignore_eos=True)
    first = cached.generate([PROMPT], params)[0]
    again = cached.generate([PROMPT], params)[0]
    without_cache = uncached.generate([PROMPT], params)[0]
    tokens = [c.token_ids for c in first.choices]
    assert tokens == [c.token_ids for c in again.choices]
    assert tokens == [c.token_ids for c in without_cache.choices]
    assert len(set(tokens)) == 4
    single = cached.generate([PROMPT], replace(params, n=1))[0]
    assert single.token_ids == tokens[0] and single.choices == ()


def test_unseeded_choices_differ(cached: LLMEngine) -> None:
    params = SamplingParams(temperature=3.0, n=3, max_tokens=12, ignore_eos=True)
    choices = cached.generate([PROMPT], params)[0].choices
    assert len({c.token_ids for c in choices}) == 3


def test_abort_ends_every_choice(cached: LLMEngine) -> None:
    cached.add_prompt("many", PROMPT, SamplingParams(n=3, max_tokens=50, ignore_eos=True))
    cached.step()  # the first choice runs; the other two wait for its prompt
    seen = {o.index for o in cached.step()}
    assert cached.abort("many")
    outs = cached.step()
    assert sorted(o.index for o in outs) == [0, 1, 2] and seen
    assert all(o.finished and o.finish_reason == "abort" for o in outs)
    assert not cached.has_unfinished()
    assert cached.block_manager.num_free_blocks == cached.block_manager.num_blocks


@pytest.mark.parametrize("n", [0, 17])
def test_n_out_of_range_is_refused(n: int) -> None:
    with pytest.raises(InvalidSamplingParams, match=r"n: 1\.\.16"):
        SamplingParams(n=n)
