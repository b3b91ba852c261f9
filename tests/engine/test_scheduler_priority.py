"""Priority, preemption, tenant fairness and wait reasons, on the fake runner (milliseconds)."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.engine.sched_helpers import Harness
from worker.engine.sequence import Sequence, SequenceStatus
from worker.engine.wait_reasons import WaitReason

BATCH, URGENT = 10, -10


def ids(seqs: list[Sequence]) -> list[str]:
    return [s.request_id for s in seqs]


def run_to_end(h: Harness, limit: int = 10_000) -> None:
    for _ in range(limit):
        if not h.seqs:
            return
        h.step()
    raise AssertionError("did not finish")


def test_urgent_job_preempts_the_newest_batch_job_and_goes_first() -> None:
    h = Harness(num_blocks=256, block_size=4, max_seqs=4, max_tokens=64)
    lows = [h.add(8, 40, priority=BATCH) for _ in range(8)]
    for _ in range(3):
        h.step()
    assert ids(h.scheduler.running) == ids(lows[:4])
    urgent = h.add(8, 5, priority=URGENT)
    out = h.step()
    # It starts within one step and its whole prompt runs, so its first token comes now,
    # before any of the four queued batch jobs has started.
    assert out.preempted_ids == (lows[3].request_id,)  # the most recently started
    assert urgent.num_output_tokens == 1
    assert all(s.num_computed_tokens == 0 and s.start_index == -1 for s in lows[4:])
    starts: list[str] = []
    while h.seqs:
        before = {s.request_id for s in h.scheduler.running}
        h.step()
        starts += [s.request_id for s in h.scheduler.running if s.request_id not in before]
    # The victim kept its place: it restarts before batch jobs that arrived after it.
    assert starts.index(lows[3].request_id) < starts.index(lows[4].request_id)
    assert all(s.num_output_tokens == 40 for s in lows)
    assert lows[3].num_preemptions == 1 and h.scheduler.preemptions_by_reason["priority"] == 1


def test_kv_exhaustion_preempts_the_least_urgent_not_the_newest() -> None:
    h = Harness(num_blocks=5, block_size=4, max_seqs=4, max_tokens=64)
    batch = h.add(4, 10, priority=BATCH)  # started first
    first = h.add(4, 10)
    second = h.add(4, 10)
    h.step()  # three prompts of one block each; each samples its 5th token
    out = h.step()  # three decodes need a new block each and two are free
    assert out.preempted_ids == (batch.request_id,)
    assert h.scheduler.preemptions_by_reason == Counter({"kv_cache_full": 1})
    assert {first.status, second.status} == {SequenceStatus.RUNNING}
    run_to_end(h)
    assert batch.num_output_tokens == 10


def test_equal_priority_never_preempts_and_the_reason_is_shown() -> None:
    h = Harness(num_blocks=64, block_size=4, max_seqs=1, max_tokens=64)
    a = h.add(4, 6)
    h.step()
    b = h.add(4, 6)
    out = h.step()
    assert out.preempted_ids == () and ids(h.scheduler.running) == [a.request_id]
    info = h.scheduler.wait_info()[b.request_id]
    assert info.reason is WaitReason.NO_BATCH_SLOT and info.position == 0


def test_a_job_preempted_k_times_for_priority_is_then_left_to_finish() -> None:
    h = Harness(num_blocks=64, block_size=4, max_seqs=1, max_tokens=64)
    long = h.add(4, 30, priority=BATCH)
    urgent: list[Sequence] = []
    for _ in range(200):
        if not h.seqs:
            break
        if long.status is SequenceStatus.RUNNING and len(urgent) < 10:
            urgent.append(h.add(4, 2, priority=URGENT))  # keeps arriving while it runs
        h.step()
    assert not h.seqs, "everything finishes: no preemption loop"
    assert long.num_priority_preemptions == h.config.max_priority_preemptions == 3
    assert long.num_output_tokens == 30 and all(u.num_output_tokens == 2 for u in urgent)


def test_urgent_job_waits_when_victims_cannot_free_enough_kv() -> None:
    h = Harness(num_blocks=4, block_size=4, max_seqs=4, max_tokens=64)
    low = h.add(4, 4, priority=BATCH)  # one block
    h.step()
    big = h.add(20, 2, priority=URGENT)  # needs five blocks: more than the whole pool
    out = h.step()
    assert out.preempted_ids == ()  # preempting would not have let it start: nobody goes
    assert h.scheduler.wait_info()[big.request_id].reason is WaitReason.KV_CACHE_FULL
    assert low.status is SequenceStatus.RUNNING


def test_tenant_cap_holds_a_tenant_back_and_lets_others_run() -> None:
    h = Harness(num_blocks=64, block_size=4, max_seqs=4, max_tokens=64, max_running_per_tenant=1)
    a1, a2 = h.add(4, 8, tenant="a"), h.add(4, 8, tenant="a")
    b1 = h.add(4, 8, tenant="b")
    h.step()
    assert ids(h.scheduler.running) == [a1.request_id, b1.request_id]
    assert h.scheduler.wait_info()[a2.request_id].reason is WaitReason.TENANT_CAP
    run_to_end(h)


def test_a_job_behind_a_blocked_urgent_one_says_so() -> None:
    h = Harness(num_blocks=64, block_size=4, max_seqs=1, max_tokens=64)
    first = h.add(4, 8, priority=URGENT)
    h.step()
    low = h.add(4, 8, priority=BATCH)
    second = h.add(4, 8, priority=URGENT)
    h.step()
    assert ids(h.scheduler.running) == [first.request_id]  # equal priority: no preemption
    info = h.scheduler.wait_info()
    assert info[second.request_id].reason is WaitReason.NO_BATCH_SLOT
    assert info[second.request_id].position == 0
    assert info[low.request_id].reason is WaitReason.BEHIND_HIGHER_PRIORITY
    assert info[low.request_id].position == 1
    run_to_end(h)


def saturated_shares(weights: dict[str, float], heavy: int, light: int) -> float:
    """Tokens generated by tenant "light" over tenant "heavy" while both have work waiting;
    "heavy" submits ``heavy`` jobs before "light" submits ``light``."""
    h = Harness(num_blocks=1024, block_size=4, max_seqs=8, max_tokens=256, tenant_weights=weights)
    for _ in range(heavy):
        h.add(6, 12, tenant="heavy")
    for _ in range(light):
        h.add(6, 12, tenant="light")
    generated: Counter[str] = Counter()
    waiting_tenants = {"heavy", "light"}
    while waiting_tenants == {"heavy", "light"}:
        out = h.step()
        for item in out.scheduled:
            if item.samples:
                generated[h.seq(item.seq_id).tenant] += 1
        waiting_tenants = {s.tenant for s in h.scheduler.waiting}
    return generated["light"] / generated["heavy"]


@pytest.mark.parametrize(("weights", "expected"), [({}, 1.0), ({"light": 3.0}, 3.0)])
def test_tenants_share_generated_tokens_by_weight(
    weights: dict[str, float], expected: float
) -> None:
    ratio = saturated_shares(weights, heavy=600, light=60)
    assert abs(ratio / expected - 1) <= 0.10, ratio
