"""Per-band TPOT targets: exact chunk sizes on tiny configs, on a fake clock (milliseconds)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from tests.engine.sched_clock import TimedHarness
from worker.engine.config import (
    DEFAULT_TPOT_TARGET_MS,
    EngineConfig,
    InvalidConfigError,
    SchedulerConfig,
)
from worker.engine.scheduler_output import SchedulerOutput
from worker.engine.sequence import Sequence
from worker.engine.step_cost import PRIOR, StepCost, StepCostModel, StepFeatures
from worker.engine.step_targets import (
    PrefillAllowance,
    format_tpot_targets,
    parse_tpot_targets,
)
from worker.engine.wait_reasons import WaitReason

INTERACTIVE, BATCH = -10, 10
# 10 ms a step, 1 ms a decode, 1 ms a prefill token, no attention term: easy sums.
MACHINE = StepCost(
    base_s=0.010, per_decode_s=0.001, per_prefill_token_s=0.001, per_context_token_s=0
)


def harness(
    machine: StepCost = MACHINE, max_tokens: int = 256, max_seqs: int = 64, **policy: Any
) -> TimedHarness:
    # The fixed target alone unless a test asks for the slowdown bound too.
    policy = {
        "tpot_target_ms": {"interactive": 50.0},
        "min_prefill_chunk_tokens": 8,
        "tpot_slowdown_max": 0.0,
        **policy,
    }
    return TimedHarness(512, 4, max_seqs, max_tokens, machine=machine, **policy)


def chats(h: TimedHarness, n: int, priority: int = INTERACTIVE) -> list[Sequence]:
    seqs = [h.add(4, 400, priority=priority) for _ in range(n)]
    h.step()  # their prompts: no decode runs yet, so the whole budget
    return seqs


def long_beside_chats(machine: StepCost = MACHINE, **policy: Any) -> tuple[TimedHarness, Sequence]:
    """4 interactive chats decoding under a 150 ms target, and a 200-token batch prompt."""
    h = harness(machine, tpot_target_ms={"interactive": 150.0}, **policy)
    chats(h, 4)
    return h, h.add(200, 4, priority=BATCH)


def chunk_of(h: TimedHarness, seq: Sequence) -> int:
    out = h.step()
    return next((s.num_scheduled_tokens for s in out.scheduled if s.seq_id == seq.seq_id), 0)


def test_prefill_fills_what_the_decodes_leave_under_the_target() -> None:
    h = harness()
    chats(h, 4)
    long = h.add(200, 4, priority=BATCH)
    # 10 ms + 4 decodes leave 36 ms of the 50 ms target: 36 prefill tokens a step.
    assert [chunk_of(h, long) for _ in range(3)] == [36, 36, 36]
    assert h.scheduler.last_allowance is not None
    assert h.scheduler.last_allowance.target_s == 0.050


def test_a_fast_machine_holds_the_step_to_the_slowdown_bound_of_its_decodes() -> None:
    h, long = long_beside_chats(tpot_slowdown_max=1.5)
    # 4 decodes cost 14 ms alone: 1.5x is 21 ms, far under 150 ms, so 7 prefill tokens a step,
    # under the floor of 8 the oldest prefill gets where the fixed target sizes the step.
    assert [chunk_of(h, long) for _ in range(3)] == [7, 7, 7]
    allowance = h.scheduler.last_allowance
    assert allowance is not None
    assert allowance.target_s == pytest.approx(0.021) and allowance.band_target_s == 0.150
    slow = StepCost(
        base_s=0.080, per_decode_s=0.001, per_prefill_token_s=0.001, per_context_token_s=0
    )
    h, long = long_beside_chats(slow, tpot_slowdown_max=1.5)
    # Slow steps (84 ms alone): 1.5x is 126 ms, under 150, so 42 tokens; with the bound off,
    # the fixed target's 66.
    assert chunk_of(h, long) == 42
    h, long = long_beside_chats(slow)
    assert chunk_of(h, long) == 66


def test_under_the_slowdown_bound_the_floor_is_owed_only_where_no_token_fits() -> None:
    costly = StepCost(
        base_s=0.010, per_decode_s=0.001, per_prefill_token_s=0.010, per_context_token_s=0
    )
    h, long = long_beside_chats(costly, tpot_slowdown_max=1.5)
    # Half of 14 ms is 7 ms, under one 10 ms token: the oldest prefill still gets its floor.
    assert chunk_of(h, long) == 8


def test_a_chat_keeps_its_admission_floor_under_the_slowdown_bound() -> None:
    h = harness(tpot_target_ms={"interactive": 150.0}, tpot_slowdown_max=1.5)
    chats(h, 4)
    long = h.add(400, 4, priority=BATCH)
    h.step()
    chat = h.add(30, 4, priority=INTERACTIVE)  # its band's target is the step's band target
    out = h.step()
    planned = {s.seq_id: s.num_scheduled_tokens for s in out.scheduled}
    assert planned.get(chat.seq_id, 0) >= 8 and long.seq_id in planned
    # Its whole 30-token prompt, up to the band's 150 ms, not the bound's 21 ms: its first token
    # comes a step sooner. The batch prompt, of a band with no target, had only the bound's 7.
    assert planned[chat.seq_id] == 30 and planned[long.seq_id] == 7


def test_with_the_attention_term_each_step_stays_under_the_target_and_is_full() -> None:
    machine = StepCost(0.010, 0.001, 0.0005, 0.00002)  # context costs: chunks shrink as it grows
    h = harness(machine, tpot_target_ms={"interactive": 60.0})
    chats(h, 4)
    h.add(400, 4, priority=BATCH)
    steps = []
    while (f := StepFeatures.of(h.step().scheduled)).num_prefill_tokens:  # the long prompt
        steps.append(f)
    for f in steps[:-1]:  # the last chunk is what was left of the prompt
        more = StepFeatures(f.num_decodes, f.num_prefill_tokens + 1, f.num_context_tokens + 1)
        assert machine.predict_s(f) <= 0.060 + 1e-9 < machine.predict_s(more)
    sizes = [f.num_prefill_tokens for f in steps]
    assert sum(sizes) == 400 and sizes[0] > sizes[-2]  # the chunks shrink as the context grows


def test_without_a_latency_sensitive_decode_a_step_uses_the_whole_budget() -> None:
    h = harness()
    chats(h, 4, priority=BATCH)  # batch has no target
    long = h.add(600, 4, priority=BATCH)
    assert chunk_of(h, long) == 256 - 4
    assert h.scheduler.last_allowance is None


def test_the_oldest_prefill_and_the_first_admission_always_get_the_minimum_chunk() -> None:
    h = harness(max_seqs=64)
    chats(h, 40)  # 10 + 40 ms: nothing left under 50 ms
    long = h.add(64, 4, priority=BATCH)
    assert chunk_of(h, long) == 8
    chat, other = h.add(20, 4, priority=INTERACTIVE), h.add(20, 4, priority=INTERACTIVE)
    out = h.step()
    planned = {s.seq_id: s.num_scheduled_tokens for s in out.scheduled}
    assert planned[long.seq_id] == 8 and planned[chat.seq_id] == 8
    assert other.seq_id not in planned
    assert h.scheduler.wait_info()[other.request_id].reason is WaitReason.TPOT_TARGET
    for _ in range(6):  # 64 tokens at 8 a step: the long prompt is not starved by the chats
        h.step()
    assert long.num_computed_tokens == 64


def test_a_burst_of_long_prompts_starts_one_floor_at_a_time() -> None:
    h = harness(max_seqs=64)
    chats(h, 40)  # nothing left under the target
    first, second, third = (h.add(64, 4, priority=BATCH) for _ in range(3))
    # Nothing else prefills: the first starts with the floor; the others, of a band without a
    # target, get no floor of their own while it runs.
    assert planned(h.step()) == {first.seq_id: 8}
    assert planned(h.step()) == {first.seq_id: 8}
    assert h.scheduler.wait_info()[second.request_id].reason is WaitReason.TPOT_TARGET
    assert third.num_computed_tokens == 0


def planned(out: SchedulerOutput) -> dict[int, int]:
    return {s.seq_id: s.num_scheduled_tokens for s in out.scheduled if not s.is_decode}


def test_a_chat_prefills_before_a_batch_prompt_which_keeps_its_floor() -> None:
    h = harness(max_tokens=512, tpot_target_ms={"interactive": 100.0})
    for _ in range(4):
        h.add(4, 400, priority=INTERACTIVE)
    batch = h.add(2000, 4, priority=BATCH)
    h.step()  # no decode yet: the whole budget, 16 tokens of chats and 496 of the prompt
    assert planned(h.step()) == {batch.seq_id: 86}  # 4 decodes leave 86 ms
    chat = h.add(150, 4, priority=INTERACTIVE)
    # The first admission of a chat gets the floor, beside the batch prompt's chunk.
    assert planned(h.step()) == {batch.seq_id: 86, chat.seq_id: 8}
    # Then the chat's prefill goes first; the batch prompt, the oldest, keeps its floor.
    assert planned(h.step()) == {chat.seq_id: 86, batch.seq_id: 8}
    assert planned(h.step()) == {chat.seq_id: 56, batch.seq_id: 30}


def test_the_cost_model_learns_a_faster_machine_and_chunks_grow() -> None:
    fast = StepCost(0.001, 0.0001, 0.00005, 0.0)  # 40x faster than our CPU prior's step
    h = TimedHarness(  # the fixed target alone: the slowdown bound is the test above
        512,
        4,
        64,
        512,
        machine=fast,
        prior=PRIOR,
        tpot_target_ms={"interactive": 50.0},
        tpot_slowdown_max=0.0,
    )
    decodes = chats(h, 4)
    on_prior = PrefillAllowance.for_step(decodes, {"interactive": 0.05}, StepCostModel(PRIOR), 8)
    assert on_prior is not None
    long = h.add(4000, 4, priority=BATCH)
    # The CPU prior alone: 50 ms - 40 ms - 4 x 1.5 ms of decodes leave 4 ms, 5 tokens.
    assert on_prior.grant(long, 4000) == 5
    # One step seen (the chats' prompts) and the model has the fast machine: the whole budget.
    assert [chunk_of(h, long) for _ in range(3)] == [512 - 4] * 3


def test_tpot_targets_from_the_command_line() -> None:
    both = {"interactive": 150.0, "default": 400.0}
    assert parse_tpot_targets("interactive=150,default=400") == both
    assert parse_tpot_targets("off") == {} and format_tpot_targets({}) == "off"
    assert format_tpot_targets(both) == "interactive=150,default=400"
    assert format_tpot_targets(DEFAULT_TPOT_TARGET_MS) == "interactive=150"
    with pytest.raises(ValueError, match="--tpot-target-ms"):
        parse_tpot_targets("urgent=100")
    parser = argparse.ArgumentParser()
    EngineConfig.add_arguments(parser)
    default = EngineConfig.from_args(parser.parse_args([])).scheduler
    assert default.tpot_target_ms == DEFAULT_TPOT_TARGET_MS == SchedulerConfig().tpot_target_ms
    args = ["--tpot-target-ms", "interactive=100", "--aging-per-s", "0"]
    config = EngineConfig.from_args(parser.parse_args(args)).scheduler
    assert config.tpot_targets_s == {"interactive": 0.1} and config.aging_per_s == 0.0


@pytest.mark.parametrize(
    "fields",
    [{"tpot_target_ms": {"urgent": 100.0}}, {"tpot_target_ms": {"batch": 0.0}},
     {"min_prefill_chunk_tokens": 0}, {"aging_per_s": -1.0}],
)  # fmt: skip
def test_bad_policy_values_are_refused_by_name(fields: dict[str, object]) -> None:
    with pytest.raises(InvalidConfigError, match=next(iter(fields))):
        SchedulerConfig(**fields)  # type: ignore[arg-type]
