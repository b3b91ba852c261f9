"""Aging: starvation bounded, equal waits keep priority order, no ping-pong, truthful waits."""

from __future__ import annotations

import random

from tests.engine.sched_clock import FakeClock, TimedHarness
from worker.engine.aging import Aging
from worker.engine.fair_share import FairShare
from worker.engine.sampling_params import SamplingParams
from worker.engine.sequence import Sequence, SequenceStatus
from worker.engine.wait_queue import WaitQueue
from worker.engine.wait_reasons import WaitReason

INTERACTIVE, DEFAULT, BATCH = -10, 0, 10


def one_slot(aging_per_s: float) -> TimedHarness:
    # One second a step, no TPOT target: only the order of admission is under test.
    return TimedHarness(64, 4, 1, 64, step_s=1.0, aging_per_s=aging_per_s, tpot_target_ms={})


def batch_start_under_a_stream_of_chats(aging_per_s: float, steps: int = 200) -> int | None:
    """The step at which a batch job starts while one new chat arrives every second."""
    h = one_slot(aging_per_s)
    batch = h.add(4, 3, priority=BATCH)
    for step in range(steps):
        h.add(4, 1, priority=INTERACTIVE)  # one step each: the slot is never free for long
        h.step()
        if batch.status is not SequenceStatus.WAITING:
            return step
    return None


def test_with_aging_a_batch_job_starts_once_it_has_waited_20_over_the_rate() -> None:
    # At 1 point a second, the batch job (10) goes before chats (-10) arriving 20 s after it.
    assert batch_start_under_a_stream_of_chats(1.0) == 21
    assert batch_start_under_a_stream_of_chats(0.5) == 41


def test_without_aging_the_batch_job_waits_for_ever() -> None:
    assert batch_start_under_a_stream_of_chats(0.0) is None


def test_at_equal_wait_the_interactive_job_goes_first_also_past_the_clamp() -> None:
    for wait_s in (5.0, 1000.0):  # 1000 s at 1/s: both clamped at the most urgent priority
        h = one_slot(1.0)
        h.add(4, 2, priority=DEFAULT)  # holds the slot
        h.step()
        batch, chat = h.add(4, 1, priority=BATCH), h.add(4, 1, priority=INTERACTIVE)
        h.clock.now_s += wait_s
        h.step()  # the default job's last token
        h.step()
        assert chat.is_finished and batch.status is SequenceStatus.WAITING
        h.step()
        assert batch.is_finished


def test_an_urgent_job_that_preempted_a_batch_job_is_never_preempted_back() -> None:
    h = one_slot(1.0)
    batch = h.add(4, 40, priority=BATCH)
    h.step()
    h.step()
    chat = h.add(4, 40, priority=INTERACTIVE)
    assert h.step().preempted_ids == (batch.request_id,)
    while h.seqs:  # the batch job ages for 40 s behind it, at the same rate as the chat
        h.step()
    assert h.scheduler.preemptions_by_reason["priority"] == 1
    assert chat.num_preemptions == 0 and batch.num_preemptions == 1


def test_a_fresh_chat_does_not_preempt_a_batch_job_that_waited_long() -> None:
    for aging_per_s, preempts in ((1.0, False), (0.0, True)):
        h = one_slot(aging_per_s)
        batch = h.add(4, 10, priority=BATCH)
        h.clock.now_s += 100.0  # it waited 100 s: 10 - 100 is more urgent than -10
        h.step()
        chat = h.add(4, 2, priority=INTERACTIVE)
        out = h.step()
        assert (out.preempted_ids == (batch.request_id,)) is preempts
        if not preempts:
            info = h.scheduler.wait_info()[chat.request_id]
            assert info.reason is WaitReason.NO_BATCH_SLOT and info.position == 0


def test_wait_reason_and_position_name_the_older_job_ahead() -> None:
    h = one_slot(1.0)
    h.add(4, 5, priority=DEFAULT)
    h.step()  # the slot is taken
    batch = h.add(4, 1, priority=BATCH)
    h.clock.now_s += 30.0
    chat = h.add(4, 1, priority=INTERACTIVE)
    h.step()
    info = h.scheduler.wait_info()
    assert (info[batch.request_id].reason, info[batch.request_id].position) == (
        WaitReason.NO_BATCH_SLOT, 0
    )  # fmt: skip
    assert (info[chat.request_id].reason, info[chat.request_id].position) == (
        WaitReason.BEHIND_OLDER_REQUEST, 1
    )  # fmt: skip


def test_the_queue_lists_waiting_sequences_in_the_order_head_admits_them() -> None:
    rng = random.Random(0)
    clock = FakeClock()
    fair, aging = FairShare(), Aging(0.5, clock)
    queue = WaitQueue(fair, aging)
    params = SamplingParams(max_tokens=1)
    for i in range(60):
        clock.now_s = float(i)
        tenant = rng.choice("abc")
        seq = Sequence(f"r{i}", [1], params, i, priority=rng.choice([-10, 0, 10]), tenant=tenant)
        fair.activate(tenant)
        aging.arrive(seq)
        queue.add(seq)
        fair.charge(tenant, prompt_tokens=rng.randint(0, 50))
    clock.now_s = 70.0
    aging.tick()
    listed = list(queue)
    admitted = []
    while (head := queue.head()) is not None:
        admitted.append(head)
        queue.remove(head)
    assert listed == admitted and len(admitted) == 60
    priorities = [s.priority for s in admitted]
    assert priorities != sorted(priorities)  # aging interleaved the levels
