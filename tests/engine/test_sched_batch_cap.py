"""Batch rows per step while more urgent work is about (worker/engine/batch_cap.py)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tests.engine.sched_clock import TimedHarness
from tests.engine.test_sched_first_token import BATCH, DEFAULT, INTERACTIVE, planned
from worker.engine.batch_cap import HOLD_S
from worker.engine.config import InvalidConfigError, SchedulerConfig
from worker.engine.sequence import Sequence


def batch_and_chat(
    rows: int, num: int = 6, chat_priority: int = INTERACTIVE, **policy: Any
) -> tuple[TimedHarness, list[Sequence], Sequence]:
    """``num`` batch sequences decoding and one more urgent one decoding beside them; each step
    takes 10 ms on the fake clock."""
    policy.setdefault("tpot_target_ms", {})  # no step-cost allowance in these decisions
    h = TimedHarness(128, 4, 8, 64, urgent_batch_rows=rows, step_s=0.01, **policy)
    batch = [h.add(4, 40, priority=BATCH) for _ in range(num)]
    h.step()  # their prompts
    chat = h.add(4, 20, priority=chat_priority)
    h.step()  # the chat's prompt (the first-token lane leaves the batch out)
    return h, batch, chat


def test_off_by_default_plans_every_decode() -> None:
    assert SchedulerConfig().urgent_batch_rows == 0
    h, batch, chat = batch_and_chat(0)
    assert set(planned(h.step())) == {s.seq_id for s in [*batch, chat]}


def test_capped_steps_rotate_every_batch_row_and_keep_their_blocks() -> None:
    h, batch, chat = batch_and_chat(2)
    blocks = {s.seq_id: list(s.block_ids) for s in batch}
    ran: Counter[int] = Counter()
    for _ in range(3):
        out = planned(h.step())
        assert chat.seq_id in out  # the urgent job runs every step
        got = [i for i in out if i != chat.seq_id]
        assert len(got) == 2 and all(out[i] == 1 for i in got)
        ran.update(got)
    assert ran == {s.seq_id: 1 for s in batch}  # three steps of two: each once
    assert all(s in h.scheduler.running and s.block_ids[: len(blocks[s.seq_id])]
               == blocks[s.seq_id] for s in batch)  # fmt: skip
    # Four capped steps: the chat's own (the lane's, which left every batch row out) and three.
    assert h.scheduler.num_preemptions == 0 and h.scheduler.batch_cap.num_steps == 4


def test_a_default_band_job_caps_batch_rows_too() -> None:
    h, _, chat = batch_and_chat(3, chat_priority=DEFAULT)
    out = planned(h.step())
    assert chat.seq_id in out and len(out) == 4


def test_the_cap_holds_after_the_urgent_job_ends_then_lifts() -> None:
    h, batch, chat = batch_and_chat(2)
    h.abort(chat.request_id)
    assert len(planned(h.step())) == 2  # just ended: the next chat must find short steps
    h.clock.now_s += HOLD_S
    assert set(planned(h.step())) == {s.seq_id for s in batch}


def test_batch_only_runs_plan_as_before() -> None:
    h = TimedHarness(128, 4, 8, 64, urgent_batch_rows=1, step_s=0.01, tpot_target_ms={})
    batch = [h.add(4, 10, priority=BATCH) for _ in range(6)]
    h.step()
    for _ in range(5):
        assert set(planned(h.step())) == {s.seq_id for s in batch}
    assert h.scheduler.batch_cap.num_steps == 0


def test_a_negative_cap_is_refused() -> None:
    with pytest.raises(InvalidConfigError, match="urgent_batch_rows"):
        SchedulerConfig(urgent_batch_rows=-1)
