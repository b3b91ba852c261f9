"""The engine end to end on a tiny random model: batching, preemption, stops, seeds, aborts."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from worker.engine.llm_engine import InvalidRequestError, LLMEngine
from worker.engine.sampling_params import SamplingParams

PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog " * 4,
    "One two three",
    "In a hole in the ground there lived a hobbit.",
    "a",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor",
]


def make_engine(
    model_dir: Path, num_blocks: int = 512, budget: int = 64, seqs: int = 8
) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            cache=CacheConfig(block_size=4, num_blocks=num_blocks),
            scheduler=SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=budget),
            # These tests count steps: the plain loop returns a step's outputs from that step's
            # call (the overlapped loop, the default on CUDA, one call later).
            overlap_steps="off",
        )
    )


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> LLMEngine:
    return make_engine(tiny_model_dir)


GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def test_batched_greedy_equals_each_prompt_alone(engine: LLMEngine) -> None:
    together = engine.generate(PROMPTS, GREEDY)
    alone = [engine.generate([p], GREEDY)[0] for p in PROMPTS]
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]
    assert all(len(c.token_ids) == 12 and c.finish_reason == "length" for c in together)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_preemption_and_chunking_do_not_change_outputs(
    tiny_model_dir: Path, engine: LLMEngine
) -> None:
    tight = make_engine(tiny_model_dir, num_blocks=24, budget=8, seqs=4)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    expected = engine.generate(PROMPTS, params)
    got = tight.generate(PROMPTS, params)
    assert tight.scheduler.num_preemptions > 0
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
    assert [c.text for c in got] == [c.text for c in expected]


def test_seeded_sampling_is_independent_of_batch_and_preemption(
    tiny_model_dir: Path, engine: LLMEngine
) -> None:
    # Temperature 4: the tied tiny model's echo token holds ~all the mass at 1 (16 tokens of
    # it from most seeds alike), so only a flatter softmax shows what the seed decides.
    seeded = SamplingParams(temperature=4.0, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)
    others = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    alone = engine.generate([PROMPTS[3]], seeded)[0]
    crowd = engine.generate(PROMPTS, [others, others, others, seeded, others, others])[3]
    tight = make_engine(tiny_model_dir, num_blocks=24, budget=8, seqs=4)
    squeezed = tight.generate(PROMPTS, [others, others, others, seeded, others, others])[3]
    assert tight.scheduler.num_preemptions > 0
    assert alone.token_ids == crowd.token_ids == squeezed.token_ids
    assert len(set(alone.token_ids)) > 4  # a spread of tokens, not one echoed
    other_seed = engine.generate(
        [PROMPTS[3]], SamplingParams(temperature=4.0, seed=99, max_tokens=16, ignore_eos=True)
    )[0]
    assert other_seed.token_ids != alone.token_ids


def test_stop_token_id_ends_with_the_token_kept_and_no_text_for_it(engine: LLMEngine) -> None:
    base = engine.generate([PROMPTS[1]], GREEDY)[0]
    stop_at = base.token_ids[4]
    first = base.token_ids.index(stop_at)
    got = engine.generate(
        [PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=(stop_at,))
    )[0]
    assert got.finish_reason == "stop"
    assert got.token_ids == base.token_ids[: first + 1]
    assert got.text == engine.tokenizer.decode(
        list(base.token_ids[:first]), skip_special_tokens=True
    )


def test_stop_string_truncates_text(engine: LLMEngine) -> None:
    base = engine.generate([PROMPTS[0]], GREEDY)[0]
    stop = base.text[len(base.text) // 2 : len(base.text) // 2 + 2]
    assert stop.strip(), base.text
    got = engine.generate(
        [PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=12, stop=(stop,))
    )[0]
    assert got.finish_reason == "stop_string"
    assert got.text == base.text[: base.text.index(stop)]


def test_min_tokens_and_max_model_len(tiny_model_dir: Path) -> None:
    small = LLMEngine(
        EngineConfig(
            model=str(tiny_model_dir),
            cache=CacheConfig(block_size=4, num_blocks=64),
            scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=20),
        )
    )
    ids = small.encode(PROMPTS[3])
    got = small.generate(
        [PROMPTS[3]], SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
    )[0]
    assert got.finish_reason == "length" and len(ids) + len(got.token_ids) == 20
    with pytest.raises(InvalidRequestError, match="max_model_len 20"):
        small.add_prompt("long", prompt_token_ids=list(range(3, 23)))


def test_abort_waiting_and_running_frees_blocks_and_reports_abort(tiny_model_dir: Path) -> None:
    eng = make_engine(tiny_model_dir, seqs=1)
    params = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    eng.add_prompt("run", PROMPTS[1], params)
    eng.add_prompt("wait", PROMPTS[2], params)
    eng.step()
    eng.step()
    assert eng.block_manager.num_free_blocks < eng.block_manager.num_blocks
    assert eng.abort("wait") and eng.abort("run")
    assert not eng.abort("never-added")
    outs = {o.request_id: o for o in eng.step()}
    assert outs["run"].finish_reason == "abort" and outs["wait"].finish_reason == "abort"
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    assert not eng.has_unfinished()


def test_new_request_joins_the_running_batch_on_the_next_step(engine: LLMEngine) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    engine.add_prompt("early", PROMPTS[0], params)
    engine.step()
    engine.add_prompt("late", PROMPTS[2], params)
    ids = {o.request_id for o in engine.step()}
    assert ids == {"early", "late"}
    engine.abort("early")
    engine.abort("late")
    engine.step()


def test_logprobs_and_chat_prompts(engine: LLMEngine) -> None:
    chat = [{"role": "user", "content": "Hi there"}]
    ids = engine.encode(chat)
    assert engine.tokenizer.decode(ids).count("<|im_start|>") == 3  # system, user, assistant
    got = engine.generate(
        [chat], SamplingParams(temperature=0.0, max_tokens=3, logprobs=2, ignore_eos=True)
    )[0]
    assert len(got.logprobs) == 3
    for token, lp in zip(got.token_ids, got.logprobs, strict=True):
        assert lp.token_id == token and lp.rank == 1 and len(lp.top) == 2
        assert lp.top[0][0] == token


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prompt": ""}, "empty"),
        ({"prompt_token_ids": [1, 10**6]}, "out of range"),
        ({}, "give a prompt"),
    ],
)
def test_bad_requests_are_clear_errors(
    engine: LLMEngine, kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        engine.add_prompt("bad", **kwargs)  # type: ignore[arg-type]
    assert not engine.has_unfinished()


def test_duplicate_request_id_is_refused(engine: LLMEngine) -> None:
    engine.add_prompt("dup", "x", GREEDY)
    with pytest.raises(InvalidRequestError, match="already"):
        engine.add_prompt("dup", "y", GREEDY)
    engine.abort("dup")
    engine.step()
