"""The per-step values the engine builds for every request: built fast, the same values."""

from __future__ import annotations

import gc

import pytest

from tests.engine.sched_helpers import Harness
from worker.engine.gc_policy import GEN0_THRESHOLD, raise_gen0_threshold
from worker.engine.outputs import RequestOutput
from worker.engine.sampling_params import SamplingParams
from worker.engine.scheduler_output import ScheduledSequence, SchedulerOutput
from worker.engine.sequence import FinishReason, Sequence

FIELDS = dict(
    request_id="r",
    new_token_ids=(5,),
    text_delta="hi",
    finished=True,
    finish_reason=FinishReason.STOP,
    num_prompt_tokens=3,
    num_output_tokens=4,
    logprobs=(),
    index=1,
    num_cached_tokens=2,
)


def test_a_fast_output_is_the_constructors_value_and_stays_frozen() -> None:
    fast = RequestOutput.fast("r", 3, 1, (5,), "hi", FinishReason.STOP, 4, (), 2)
    built = RequestOutput(**FIELDS)  # type: ignore[arg-type]
    assert fast == built and hash(fast) == hash(built) and repr(fast) == repr(built)
    assert fast.error is None and fast.error_type is None  # a default left out is the default
    assert fast._replace(error="boom").error == "boom" and fast.error is None
    with pytest.raises(AttributeError):
        fast.text_delta = "other"  # type: ignore[misc]
    going = RequestOutput.fast("r", 3, 0, (7,), "", None, 1, (), 0)
    assert not going.finished and going.finish_reason is None and going.index == 0


def sequence(tokens: int, computed: int, blocks: tuple[int, ...]) -> Sequence:
    seq = Sequence("r", list(range(100, 100 + tokens)), SamplingParams(), 0)
    seq.num_computed_tokens, seq.block_ids = computed, blocks
    return seq


def test_a_step_puts_decodes_first_in_running_order_with_their_tokens_and_blocks() -> None:
    chunk, first, second = sequence(10, 4, (1,)), sequence(6, 5, (2, 3)), sequence(3, 2, (4,))
    out = SchedulerOutput.build([(chunk, 3), (first, 1), (second, 1)], [second])
    assert out.scheduled == (
        ScheduledSequence("r", (105,), 5, (2, 3), True, first.seq_id),
        ScheduledSequence("r", (102,), 2, (4,), True, second.seq_id),
        ScheduledSequence("r", (104, 105, 106), 4, (1,), False, chunk.seq_id),
    )
    assert out.num_batched_tokens == 5 and out.num_decodes == 2 and out.preempted_ids == ("r",)
    assert out.num_context_tokens == (5 + 1) + (2 + 1) + (4 + 3)  # computed + new, per row
    # Counted in the pass that built it, as the constructor counts them from the rows.
    assert out == SchedulerOutput(out.scheduled, 5, ("r",))
    first.block_ids += (9,)  # the step keeps the table it was given
    assert out.scheduled[0].block_ids == (2, 3) and out.scheduled[2].num_scheduled_tokens == 3


def test_the_young_generation_threshold_is_raised_never_lowered() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        raise_gen0_threshold()
        assert gc.get_threshold() == (GEN0_THRESHOLD, 10, 10)
        gc.set_threshold(GEN0_THRESHOLD * 2, 5, 5)
        raise_gen0_threshold()
        assert gc.get_threshold() == (GEN0_THRESHOLD * 2, 5, 5)
    finally:
        gc.set_threshold(*before)


def test_decode_rows_built_while_planned_are_builds_rows_and_a_preempted_one_leaves() -> None:
    # Three decodes need a new block each and two are free: the batch job, planned first,
    # is preempted for the third row, so the row built for it must leave the step.
    h = Harness(num_blocks=5, block_size=4, max_seqs=4, max_tokens=64)
    batch = h.add(4, 10, priority=10)
    first, second = h.add(4, 10), h.add(4, 10)
    h.step()
    out = h.scheduler.schedule()
    assert out.preempted_ids == (batch.request_id,)
    assert out == SchedulerOutput.build([(first, 1), (second, 1)], [batch])
    assert [s.seq_id for s in out.scheduled] == [first.seq_id, second.seq_id]
    assert out.num_context_tokens == 2 * 5 and out.num_decodes == 2
    assert all(len(item.block_ids) == 2 for item in out.scheduled)  # built after allocation
    h.check_output(out)


def test_a_step_with_decodes_and_a_chunk_keeps_decodes_first_in_running_order() -> None:
    h = Harness(num_blocks=64, block_size=4, max_seqs=4, max_tokens=8)
    a, b = h.add(3, 5), h.add(3, 5)
    h.step()  # both prompts: each samples its first token
    late = h.add(20, 5)
    out = h.scheduler.schedule()  # two decodes, then the new prompt's first chunk
    assert [s.seq_id for s in out.scheduled] == [a.seq_id, b.seq_id, late.seq_id]
    assert out == SchedulerOutput.build([(a, 1), (b, 1), (late, 6)], [])
    h.check_output(out)
