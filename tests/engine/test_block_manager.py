from __future__ import annotations

import pytest

from worker.engine.block_manager import BlockManager
from worker.engine.sampling_params import SamplingParams
from worker.engine.sequence import Sequence


def make_seq(n: int, rid: str = "a") -> Sequence:
    return Sequence(rid, list(range(n)), SamplingParams(), 0)


def test_allocate_grows_block_table_on_demand_with_exact_ids() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq(6)
    assert bm.num_new_blocks(seq, 6) == 2
    bm.allocate(seq, 6)
    assert seq.block_ids == (0, 1)
    seq.num_computed_tokens = 6
    assert bm.num_new_blocks(seq, 2) == 0  # slots 6 and 7 are in block 1
    assert bm.num_new_blocks(seq, 3) == 1
    bm.allocate(seq, 3)
    assert seq.block_ids == (0, 1, 2)
    assert bm.num_free_blocks == 5
    bm.assert_invariants([seq])


def test_free_returns_blocks_tail_first_and_they_are_reused_in_that_order() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    a, b = make_seq(4, "a"), make_seq(2, "b")
    bm.allocate(a, 4)
    bm.allocate(b, 2)
    assert (a.block_ids, b.block_ids) == ((0, 1), (2,))
    bm.free(a)
    assert a.block_ids == () and bm.num_free_blocks == 3
    c = make_seq(6, "c")
    bm.allocate(c, 6)
    assert c.block_ids == (3, 1, 0)  # never-used block first, then a's tail before its head
    bm.assert_invariants([b, c])


def test_can_allocate_is_exact_at_the_boundary() -> None:
    bm = BlockManager(num_blocks=3, block_size=4)
    seq = make_seq(12)
    assert bm.can_allocate(seq, 12)
    assert not bm.can_allocate(seq, 13)
    with pytest.raises(RuntimeError, match="without can_allocate"):
        bm.allocate(seq, 13)
    assert seq.block_ids == () and bm.num_free_blocks == 3


def test_usage_reports_utilisation_and_waste() -> None:
    bm = BlockManager(num_blocks=10, block_size=4)
    seq = make_seq(5)
    bm.allocate(seq, 5)
    usage = bm.usage([seq])
    assert usage.num_used_blocks == 2
    assert usage.utilisation == pytest.approx(0.2)
    assert usage.num_used_slots == 8 and usage.num_token_slots == 5
    assert usage.waste_slots == 3
    assert usage.waste_fraction == pytest.approx(3 / 8)


def test_assert_invariants_catches_a_double_owned_block() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    a, b = make_seq(2, "a"), make_seq(2, "b")
    bm.allocate(a, 2)
    b.block_ids = a.block_ids  # corrupt: two owners, ref count 1
    with pytest.raises(AssertionError, match="2 owners, ref count 1"):
        bm.assert_invariants([a, b])


def test_assert_invariants_catches_a_leaked_block() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    a = make_seq(2)
    bm.allocate(a, 2)
    a.block_ids = ()  # dropped without free
    with pytest.raises(AssertionError, match="leaked"):
        bm.assert_invariants([a])
