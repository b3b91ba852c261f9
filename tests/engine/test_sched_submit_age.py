"""Aging counts from submission: a request's arrival (``arrival_s``, e.g. its submission to
Redis) ages it in the engine, not the moment the scheduler first sees it."""

from __future__ import annotations

from tests.engine.sched_clock import TimedHarness
from worker.engine.aging import aging_key, effective_priority
from worker.engine.sampling_params import SamplingParams
from worker.engine.sequence import Sequence, SequenceStatus

INTERACTIVE, BATCH = -10, 10


def test_the_rule_is_one_function_clamped_at_the_most_urgent_priority() -> None:
    assert effective_priority(BATCH, 30.0, 1.0) == -20.0
    assert effective_priority(BATCH, 30.0, 0.0) == 10.0  # off
    assert effective_priority(BATCH, 1e6, 1.0) == -100.0
    assert effective_priority(BATCH, -5.0, 1.0) == 10.0  # a skewed clock never deprioritises
    assert aging_key(INTERACTIVE, 1e6, 1.0) < aging_key(BATCH, 1e6, 1.0)  # ties: priority


def start_step(waited_s: float, aging_per_s: float = 1.0) -> int | None:
    """The step at which a batch request submitted ``waited_s`` before it reached the
    scheduler starts in a one-slot engine where a fresh chat arrives every second."""
    h = TimedHarness(64, 4, 1, 64, step_s=1.0, aging_per_s=aging_per_s, tpot_target_ms={})
    seq = Sequence("batch", [1, 2, 3, 4], SamplingParams(max_tokens=3), 0, priority=BATCH)
    h.seqs[seq.seq_id] = seq
    h.scheduler.add(seq, (), h.clock.now_s - waited_s)
    for step in range(60):
        h.add(4, 1, priority=INTERACTIVE)
        h.step()
        if seq.status is not SequenceStatus.WAITING:
            return step
    return None


def test_a_request_that_waited_before_the_scheduler_starts_that_much_sooner() -> None:
    assert start_step(0.0) == 21  # 20 / rate after it reached the scheduler
    assert start_step(15.0) == 6  # 15 s of it spent in Redis, the inbox or compiling
    assert start_step(25.0) == 0  # already older than the bound: first
    assert start_step(25.0, aging_per_s=0.0) is None  # off: it waits
