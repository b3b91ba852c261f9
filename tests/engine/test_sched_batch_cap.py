"""Batch work per step while more urgent work is about (worker/engine/batch_cap.py).

Fake clock: ``CPU`` steps cost 10 ms plus 5 ms a row or prompt token. A chat's 4-token prompt
step costs 30 ms: the reference, and at ``urgent_step_max`` 1.0 the steering target, which a
step of one chat decode (15 ms) and three batch rows (15 ms) meets."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import rule

from tests.engine.sched_clock import TimedHarness
from tests.engine.sched_helpers import HarnessMachine
from tests.engine.test_sched_first_token import BATCH, DEFAULT, INTERACTIVE, planned
from worker.engine.batch_cap import FIRST_TOKEN_STEPS, HOLD_S, INITIAL_UNITS
from worker.engine.config import (
    DEFAULT_URGENT_STEP_MAX,
    EngineConfig,
    InvalidConfigError,
    SchedulerConfig,
)
from worker.engine.scheduler_output import SchedulerOutput
from worker.engine.sequence import Sequence
from worker.engine.step_cost import StepCost, StepFeatures
from worker.engine.wait_reasons import WaitReason

CPU = StepCost(base_s=0.010, per_decode_s=0.005, per_prefill_token_s=0.005, per_context_token_s=0)
# A GPU-like step: a row costs 1% of the step's fixed cost.
GPU = StepCost(base_s=0.010, per_decode_s=0.0001, per_prefill_token_s=0.0001, per_context_token_s=0)


def harness(machine: StepCost = CPU, **policy: Any) -> TimedHarness:
    policy.setdefault("tpot_target_ms", {})  # no TPOT allowance in these decisions
    policy.setdefault("urgent_step_max", 1.0)  # the target is the reference itself
    return TimedHarness(2048, 4, 64, 512, machine=machine, **policy)


def batch_and_chat(
    num: int = 12, chat_priority: int = INTERACTIVE, machine: StepCost = CPU, **policy: Any
) -> tuple[TimedHarness, list[Sequence], Sequence]:
    """``num`` batch sequences decoding, then a more urgent one's prompt step: batch rows out."""
    h = harness(machine, **policy)
    batch = [h.add(4, 400, priority=BATCH) for _ in range(num)]
    h.step()  # their prompts
    chat = h.add(4, 400, priority=chat_priority)
    assert set(planned(h.step())) == {chat.seq_id}
    return h, batch, chat


def cost_s(h: TimedHarness, out: SchedulerOutput) -> float:
    assert h.machine is not None
    return h.machine.predict_s(StepFeatures.of(out.scheduled))


def test_on_by_default_by_device_and_from_the_command_line() -> None:
    config = SchedulerConfig()
    assert config.urgent_step_max is None  # the engine resolves it for its device
    assert config.resolved("cpu").urgent_step_max == DEFAULT_URGENT_STEP_MAX["cpu"] == 0.75
    assert config.resolved("cuda").urgent_step_max == 2.0
    assert SchedulerConfig(urgent_step_max=0.0).resolved("cpu").urgent_step_max == 0.0
    parser = argparse.ArgumentParser()
    EngineConfig.add_arguments(parser)
    args = parser.parse_args(["--urgent-step-max", "2.5"])
    assert EngineConfig.from_args(args).scheduler.resolved("cpu").urgent_step_max == 2.5
    assert parser.parse_args([]).urgent_step_max is None


def test_a_first_token_step_carries_no_batch_work_and_is_the_reference() -> None:
    h, _, chat = batch_and_chat(chat_priority=DEFAULT)  # the lane is interactive's alone
    out = h.step()
    assert h.scheduler.batch_bound.reference_s == pytest.approx(0.030)  # the chat's prompt step
    assert planned(out)[chat.seq_id] == 1 and len(planned(out)) == 1 + int(INITIAL_UNITS)


def test_bounded_steps_settle_at_the_target_and_rotate_every_batch_row() -> None:
    h, batch, chat = batch_and_chat()
    blocks = {s.seq_id: s.block_ids for s in batch}
    costs = [cost_s(h, h.step()) for _ in range(6)]
    assert costs[0] == pytest.approx(0.055)  # 8 batch rows at first: over the 30 ms target
    assert all(c == pytest.approx(0.030) for c in costs[3:])  # steered: 3 rows
    ran: Counter[int] = Counter()
    for _ in range(8):
        got = planned(h.step())
        assert chat.seq_id in got  # the urgent job runs every step
        ran.update(i for i in got if i != chat.seq_id)
    assert ran == {s.seq_id: 2 for s in batch}  # eight steps of three over twelve: each twice
    assert all(s in h.scheduler.running and s.block_ids[: len(blocks[s.seq_id])]
               == blocks[s.seq_id] for s in batch)  # fmt: skip
    assert h.scheduler.num_preemptions == 0 and h.scheduler.batch_bound.num_steps == 14


def test_off_plans_every_decode() -> None:
    h, batch, chat = batch_and_chat(urgent_step_max=0.0)
    assert set(planned(h.step())) == {s.seq_id for s in [*batch, chat]}


def test_the_bound_holds_after_the_urgent_job_ends_then_lifts() -> None:
    h, batch, chat = batch_and_chat()
    h.abort(chat.request_id)
    assert len(planned(h.step())) == int(INITIAL_UNITS)  # the next chat must find short steps
    h.clock.now_s += HOLD_S
    assert set(planned(h.step())) == {s.seq_id for s in batch}


def test_batch_prompts_start_in_what_is_left_and_wait_for_urgent_work() -> None:
    h, batch, _ = batch_and_chat(num=5)
    late = h.add(40, 4, priority=BATCH)
    got = planned(h.step())  # 8 units: the 5 decodes, then 3 of the prompt's tokens
    assert got[late.seq_id] == 3 and all(s.seq_id in got for s in batch)
    wait = h.add(40, 4, priority=BATCH)
    h.step()
    assert h.scheduler.wait_info()[wait.request_id].reason is WaitReason.URGENT_WORK


def test_batch_work_gets_one_row_a_step_however_long_the_urgent_work() -> None:
    h = harness()
    batch = [h.add(4, 400, priority=BATCH) for _ in range(4)]
    h.step()
    chats = [h.add(4, 400, priority=DEFAULT) for _ in range(12)]  # 12 decodes: 70 ms alone
    h.step()  # their prompts: the reference (250 ms), so the target is far
    for _ in range(4):
        h.step()  # 12 decodes and the batch: 70 + 20 ms over a 30 ms target: down to the floor
    h.scheduler.batch_bound.reference_s = 0.030  # as if a chat's short prompt step came
    for _ in range(8):
        h.step()
    ran: Counter[int] = Counter()
    for _ in range(8):
        got = planned(h.step())
        assert all(c.seq_id in got for c in chats)
        rows = [s.seq_id for s in batch if s.seq_id in got]
        assert len(rows) == 1
        ran.update(rows)
    assert ran == {s.seq_id: 2 for s in batch}


def test_first_token_steps_leave_batch_work_out_at_most_two_in_a_row() -> None:
    h, batch, _ = batch_and_chat(chat_priority=DEFAULT)
    with_batch = []
    for _ in range(9):
        h.add(4, 400, priority=DEFAULT)  # a new chat every step
        got = planned(h.step())
        with_batch.append(any(s.seq_id in got for s in batch))
    # The first chat's step began the streak: one more without batch work, then every third.
    assert FIRST_TOKEN_STEPS == 2
    assert with_batch == [False, True, False, False, True, False, False, True, False]


def test_on_a_gpu_like_machine_units_grow_until_every_batch_decode_fits() -> None:
    cuda = DEFAULT_URGENT_STEP_MAX["cuda"]
    h, batch, chat = batch_and_chat(num=48, machine=GPU, urgent_step_max=cuda)
    for _ in range(15):
        h.step()
    for _ in range(3):
        assert set(planned(h.step())) == {s.seq_id for s in [*batch, chat]}


def test_batch_only_runs_plan_as_before() -> None:
    h = harness()
    batch = [h.add(4, 10, priority=BATCH) for _ in range(20)]
    h.step()
    for _ in range(5):
        assert set(planned(h.step())) == {s.seq_id for s in batch}
    assert h.scheduler.batch_bound.num_steps == 0


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(InvalidConfigError, match="urgent_step_max"):
        SchedulerConfig(urgent_step_max=-1)


class BoundMachine(HarnessMachine):
    """Random add / step / abort of three bands under the bound (tight blocks, so preemption
    too): no block leaks or budget breaks, and every request finishes (none starves)."""

    def __init__(self) -> None:
        super().__init__()
        # The fake clock: the hold and the steering read step times, which must replay exactly.
        self.h = TimedHarness(16, 4, 4, 12, machine=CPU, urgent_step_max=1.0)

    @rule(
        prompt_len=st.integers(1, 30),
        max_tokens=st.integers(1, 12),
        priority=st.sampled_from([INTERACTIVE, DEFAULT, BATCH]),
    )
    def add(self, prompt_len: int, max_tokens: int, priority: int) -> None:
        self.h.add(prompt_len, max_tokens, priority=priority)


TestBoundMachine = BoundMachine.TestCase
TestBoundMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
