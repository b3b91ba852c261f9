"""The first-token lane (worker/engine/first_token.py): exact decisions on tiny configs."""

from __future__ import annotations

from typing import Any

from tests.engine.sched_helpers import Harness
from worker.engine.sequence import Sequence
from worker.engine.wait_reasons import WaitReason

BATCH, DEFAULT, INTERACTIVE = 10, 0, -10


def batch_decoding(num: int = 4, **policy: Any) -> tuple[Harness, list[Sequence]]:
    """A harness with ``num`` batch sequences past their prompts (decoding)."""
    policy.setdefault("tpot_target_ms", {})  # no step-cost allowance in these decisions
    h = Harness(64, 4, 8, 32, **policy)
    seqs = [h.add(4, 20, priority=BATCH) for _ in range(num)]
    h.step()  # their prompts: 16 tokens
    return h, seqs


def planned(out: Any) -> dict[int, int]:
    return {s.seq_id: s.num_scheduled_tokens for s in out.scheduled}


def test_the_lane_leaves_batch_decodes_out_for_one_step_and_keeps_their_blocks() -> None:
    h, batch = batch_decoding()
    blocks = {s.seq_id: s.block_ids for s in batch}
    chat = h.add(8, 4, priority=INTERACTIVE)
    assert planned(h.step()) == {chat.seq_id: 8}  # the step costs what the prompt costs
    assert h.scheduler.lane.num_steps == 1
    assert all(s.block_ids == blocks[s.seq_id] and s in h.scheduler.running for s in batch)
    assert planned(h.step()) == {s.seq_id: 1 for s in [*batch, chat]}  # all back next step


def test_default_band_decodes_are_left_out_too_and_interactive_ones_kept() -> None:
    h = Harness(64, 4, 8, 32, tpot_target_ms={})
    other, mine = h.add(4, 20, priority=DEFAULT), h.add(4, 20, priority=INTERACTIVE)
    h.step()
    chat = h.add(8, 4, priority=INTERACTIVE)
    assert planned(h.step()) == {mine.seq_id: 1, chat.seq_id: 8}
    assert other.seq_id in planned(h.step())


def test_at_most_k_consecutive_steps_leave_decodes_out() -> None:
    h, batch = batch_decoding(first_token_lane_steps=1)
    first = h.add(8, 4, priority=INTERACTIVE)
    assert planned(h.step()) == {first.seq_id: 8}
    second = h.add(8, 4, priority=INTERACTIVE)
    out = planned(h.step())  # the bound: this step carries the batch decodes again
    assert out == {**{s.seq_id: 1 for s in [*batch, first]}, second.seq_id: 8}
    third = h.add(8, 4, priority=INTERACTIVE)
    assert set(planned(h.step())) == {first.seq_id, second.seq_id, third.seq_id}  # lane again
    assert h.scheduler.lane.num_steps == 2


def test_off_plans_every_decode() -> None:
    h, batch = batch_decoding(first_token_lane_steps=0)
    chat = h.add(8, 4, priority=INTERACTIVE)
    assert planned(h.step()) == {**{s.seq_id: 1 for s in batch}, chat.seq_id: 8}


def test_no_lane_without_a_waiting_first_token_that_fits() -> None:
    h, batch = batch_decoding()
    long = h.add(40, 4, priority=INTERACTIVE)  # 40 tokens > the 32-token budget
    out = planned(h.step())
    assert all(out[s.seq_id] == 1 for s in batch) and out[long.seq_id] == 28
    assert planned(h.step()) == {long.seq_id: 12}  # its last chunk fits: the lane
    # its first token is out: its decodes and the batch's share steps, no lane
    assert planned(h.step()) == {s.seq_id: 1 for s in [*batch, long]}
    assert h.scheduler.lane.num_steps == 1


def test_the_last_chunk_of_a_running_prompt_takes_the_lane() -> None:
    h, _ = batch_decoding(num=2)
    long = h.add(40, 4, priority=INTERACTIVE)
    assert planned(h.step())[long.seq_id] == 30  # 32 less the 2 batch decodes
    assert planned(h.step()) == {long.seq_id: 10}


def test_a_first_token_that_cannot_start_leaves_nothing_out() -> None:
    h, batch = batch_decoding(num=8, preempt_for_priority=False)  # 8 of 8 slots
    chat = h.add(8, 4, priority=INTERACTIVE)
    assert planned(h.step()) == {s.seq_id: 1 for s in batch}
    assert h.scheduler.lane.num_steps == 0
    assert h.scheduler.wait_info()[chat.request_id].reason is WaitReason.NO_BATCH_SLOT


def test_a_lane_step_starts_no_batch_prompt_and_says_so() -> None:
    h, _ = batch_decoding()
    chat, late = h.add(8, 4, priority=INTERACTIVE), h.add(4, 4, priority=BATCH)
    assert planned(h.step()) == {chat.seq_id: 8}
    assert h.scheduler.wait_info()[late.request_id].reason is WaitReason.STEP_BUDGET
    assert late.seq_id in planned(h.step())


def test_a_cached_prefix_is_counted_off_when_a_first_token_fits() -> None:
    h = Harness(64, 4, 8, 32, prefix_caching=True, tpot_target_ms={})
    shared = list(range(1, 41))  # 40 tokens, 10 full blocks
    h.add_tokens(shared, 1, priority=INTERACTIVE)
    for _ in range(2):  # 32 + 8 tokens: computed and cached, and finished
        h.step()
    batch = [h.add(4, 20, priority=BATCH) for _ in range(4)]
    h.step()
    (chat,) = h.add_tokens([*shared, 41, 42, 43, 44], 4, priority=INTERACTIVE)
    # 44 tokens > the 32-token budget, but 40 are cached: its last 4 fit, so the lane
    assert planned(h.step()) == {chat.seq_id: 4}
    assert chat.num_cached_tokens == 40
    assert planned(h.step()) == {s.seq_id: 1 for s in [*batch, chat]}
