from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import rule

from tests.engine.sched_helpers import SAMPLED_TOKEN, Harness, HarnessMachine


def test_a_sequence_arriving_at_step_k_runs_at_step_k_plus_1() -> None:
    h = Harness(num_blocks=64, block_size=4, max_seqs=8, max_tokens=64)
    first = h.add(prompt_len=5, max_tokens=20)
    for _ in range(3):
        h.step()
    late = h.add(prompt_len=3, max_tokens=5)
    out = h.step()
    ids = [s.request_id for s in out.scheduled]
    assert ids == [first.request_id, late.request_id]  # the decode first, then the new prefill
    assert out.scheduled[1].num_scheduled_tokens == 3 and out.scheduled[1].samples


def test_chunked_prefill_keeps_decodes_running_every_step() -> None:
    h = Harness(num_blocks=128, block_size=4, max_seqs=4, max_tokens=8)
    short = h.add(prompt_len=2, max_tokens=30)
    h.step()  # short prefilled, sampled its first token
    long = h.add(prompt_len=40, max_tokens=2)
    chunks = []
    while long.num_output_tokens == 0:
        before = short.num_output_tokens
        out = h.step()
        assert short.num_output_tokens == before + 1  # a token for the decode every step
        chunks.append(
            next(s.num_scheduled_tokens for s in out.scheduled if s.request_id == long.request_id)
        )
    # 8-token budget, 1 for the decode: 7-token chunks until the 40 prompt tokens are done.
    assert chunks == [7, 7, 7, 7, 7, 5]


def test_budget_limits_admission_in_arrival_order() -> None:
    h = Harness(num_blocks=64, block_size=4, max_seqs=2, max_tokens=64)
    seqs = [h.add(prompt_len=4, max_tokens=3) for _ in range(3)]
    out = h.step()
    assert [s.request_id for s in out.scheduled] == [seqs[0].request_id, seqs[1].request_id]
    assert list(h.scheduler.waiting) == [seqs[2]]


def test_preemption_frees_the_most_recent_and_recomputes_it_from_scratch() -> None:
    # 4 blocks of 2 tokens: two sequences of 3-token prompts fill them once they grow.
    h = Harness(num_blocks=4, block_size=2, max_seqs=4, max_tokens=16)
    a = h.add(prompt_len=3, max_tokens=6)
    b = h.add(prompt_len=3, max_tokens=6)
    h.step()  # both prefilled: 2 blocks each, every block taken
    assert h.bm.num_free_blocks == 0
    h.step()  # position 3 of each still fits in its second block
    assert h.scheduler.num_preemptions == 0
    out = h.step()  # position 4 of a needs a third block: b, admitted last, is preempted
    assert out.preempted_ids == (b.request_id,)
    assert [s.request_id for s in out.scheduled] == [a.request_id]
    assert b.num_computed_tokens == 0 and b.block_ids == () and b.num_output_tokens == 2
    assert list(h.scheduler.waiting) == [b]
    while h.seqs:
        h.step()
    assert a.output_token_ids == [SAMPLED_TOKEN] * 6
    assert b.output_token_ids == [SAMPLED_TOKEN] * 6  # nothing lost or duplicated across preemption


def test_abort_while_waiting_and_while_running_returns_blocks_at_once() -> None:
    h = Harness(num_blocks=16, block_size=4, max_seqs=1, max_tokens=64)
    running = h.add(prompt_len=9, max_tokens=50)
    waiting = h.add(prompt_len=4, max_tokens=5)
    h.step()
    assert h.bm.num_free_blocks == 16 - 3
    h.abort(waiting.request_id)
    h.abort(running.request_id)
    assert h.bm.num_free_blocks == 16
    assert h.scheduler.num_unfinished == 0
    assert h.scheduler.schedule().is_empty


class SchedulerMachine(HarnessMachine):
    """Random add / step / abort sequences never leak or double-own a block or break a budget."""

    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(num_blocks=12, block_size=4, max_seqs=3, max_tokens=10)

    @rule(prompt_len=st.integers(1, 30), max_tokens=st.integers(1, 12))
    def add(self, prompt_len: int, max_tokens: int) -> None:
        self.h.add(prompt_len, max_tokens)


TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
