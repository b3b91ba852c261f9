"""Prefix caching in the block manager: exact block ids, eviction order, salts, collisions."""

from __future__ import annotations

import pytest

from worker.engine import prefix_cache
from worker.engine.block_manager import BlockManager
from worker.engine.prefix_cache import NO_HIT, PrefixHit
from worker.engine.sampling_params import SamplingParams
from worker.engine.sequence import Sequence


def make_seq(tokens: list[int], rid: str = "a", salt: str | None = None) -> Sequence:
    return Sequence(rid, tokens, SamplingParams(), 0, cache_salt=salt)


def admit(bm: BlockManager, seq: Sequence) -> PrefixHit:
    """Admit ``seq`` with its whole uncached rest in one step, as the scheduler would."""
    hit = bm.lookup(seq)
    num_new = seq.num_tokens - hit.num_tokens
    assert bm.can_allocate(seq, num_new, hit)
    bm.allocate(seq, num_new, hit)
    return hit


def compute(bm: BlockManager, seq: Sequence) -> None:
    """The step ran: every token of ``seq`` is computed and its full blocks get named."""
    before = seq.num_computed_tokens
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_full_blocks(seq, before)


def test_full_blocks_are_named_and_shared_with_exact_ids() -> None:
    bm = BlockManager(8, 4, enable_prefix_caching=True)
    a = make_seq(list(range(10)), "a")
    assert admit(bm, a) == NO_HIT
    compute(bm, a)
    assert a.block_ids == (0, 1, 2)
    assert bm.cache_stats().num_cached_blocks == 2  # block 2 holds 2 tokens: not named
    b = make_seq([*range(8), 99, 98], "b")
    hit = admit(bm, b)
    assert hit == PrefixHit((0, 1), 8, 0)  # owned by a: no free block is taken for them
    assert b.block_ids == (0, 1, 3) and b.num_computed_tokens == 8
    assert bm.ref_counts[:4] == [2, 2, 1, 1]
    bm.assert_invariants([a, b])
    bm.free(a)
    assert bm.ref_counts[:4] == [1, 1, 0, 1] and bm.prefix_cache is not None
    assert bm.prefix_cache.parked() == []  # still owned by b
    compute(bm, b)
    bm.free(b)
    # b's tail first: its blocks are parked in the order 1, 0 (block 3 holds 2 tokens).
    assert bm.prefix_cache.parked() == [1, 0]
    assert bm.num_free_blocks == 8
    stats = bm.cache_stats()
    assert (stats.num_query_tokens, stats.num_hit_tokens) == (20, 8)
    assert stats.num_cached_free_blocks == 2 and stats.hit_rate == pytest.approx(0.4)
    bm.assert_invariants([])


def test_unnamed_free_blocks_go_first_then_least_recently_freed_tail_first() -> None:
    bm = BlockManager(4, 2, enable_prefix_caching=True)
    a = make_seq([1, 2, 3, 4, 5], "a")
    admit(bm, a)
    compute(bm, a)
    assert a.block_ids == (0, 1, 2)
    bm.free(a)  # 2 (partial) is unnamed; 1 and 0 are parked, tail first
    assert bm.prefix_cache is not None and bm.prefix_cache.parked() == [1, 0]
    c = make_seq([9, 9, 9, 9, 9, 9], "c")
    admit(bm, c)
    # Never-used 3, then a's unnamed 2, then the oldest parked block: a's tail before its head.
    assert c.block_ids == (3, 2, 1)
    assert bm.cache_stats().num_evictions == 1 and bm.prefix_cache.parked() == [0]
    d = make_seq([1, 2, 3, 4, 5], "d")
    assert bm.lookup(d) == PrefixHit((0,), 2, 1)  # a's head survived, parked
    assert bm.can_allocate(d, 3, bm.lookup(d)) is False  # 1 parked + 2 fresh > 1 free
    bm.free(c)  # c computed nothing: its blocks are unnamed, freed tail first
    admit(bm, d)
    assert d.block_ids == (0, 1, 2) and bm.prefix_cache.parked() == []
    bm.assert_invariants([d])


def test_a_fully_cached_prompt_recomputes_its_last_block() -> None:
    bm = BlockManager(8, 4, enable_prefix_caching=True)
    a = make_seq(list(range(8)))
    admit(bm, a)
    compute(bm, a)
    b = make_seq(list(range(8)), "b")
    hit = admit(bm, b)
    # Both blocks are cached, but one token must be computed for logits and its K/V must not go
    # into the shared block 1: b takes block 0 only and recomputes tokens 4..7 in block 2.
    assert hit.block_ids == (0,) and b.num_computed_tokens == 4
    assert b.block_ids == (0, 2)
    compute(bm, b)  # block 2 now duplicates block 1: it stays unnamed
    assert bm.prefix_cache is not None and not bm.prefix_cache.is_cached(2)
    bm.assert_invariants([a, b])


def test_a_salt_only_hits_blocks_cached_with_the_same_salt() -> None:
    bm = BlockManager(16, 4, enable_prefix_caching=True)
    tokens = list(range(9))
    first = make_seq(tokens, "a", salt="tenant-a")
    admit(bm, first)
    compute(bm, first)
    for salt, expected in [("tenant-b", 0), (None, 0), ("", 0), ("tenant-a", 8)]:
        assert bm.lookup(make_seq(tokens, "x", salt=salt)).num_tokens == expected, salt
    unsalted = make_seq(tokens, "u")
    admit(bm, unsalted)
    compute(bm, unsalted)
    assert bm.lookup(make_seq(tokens, "y")).num_tokens == 8
    assert bm.lookup(make_seq(tokens, "z", salt="tenant-b")).num_tokens == 0


def test_a_digest_collision_is_a_miss_not_someone_elses_kv(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(prefix_cache, "block_digest", lambda *_: b"\x00" * 32)
    bm = BlockManager(8, 2, enable_prefix_caching=True)
    a = make_seq([1, 2, 3, 4, 5])
    admit(bm, a)
    compute(bm, a)
    assert bm.cache_stats().num_cached_blocks == 1  # block 1 collided with block 0: unnamed
    assert bm.lookup(make_seq([7, 8, 3, 4, 5])) == NO_HIT  # digest found, tokens differ
    assert bm.lookup(make_seq([1, 2, 3, 4, 5])).block_ids == (0,)
    bm.assert_invariants([a])


def test_with_caching_off_nothing_is_named_or_looked_up() -> None:
    bm = BlockManager(4, 2)
    a = make_seq([1, 2, 3, 4, 5])
    admit(bm, a)
    compute(bm, a)
    bm.free(a)
    assert bm.lookup(make_seq([1, 2, 3, 4, 5])) == NO_HIT
    assert bm.cache_stats().num_cached_blocks == 0 and bm.num_free_blocks == 4
    c = make_seq([9] * 8)
    admit(bm, c)
    assert c.block_ids == (3, 2, 1, 0)  # exactly the pool without a cache: free order


def test_assert_invariants_catches_a_shared_unnamed_block_and_a_write_into_a_named_one() -> None:
    bm = BlockManager(8, 4, enable_prefix_caching=True)
    a, b = make_seq(list(range(6)), "a"), make_seq(list(range(6)), "b")
    admit(bm, a)
    b.block_ids = (a.block_ids[1],)
    bm.ref_counts[a.block_ids[1]] += 1  # shared, ref counts right, but block 1 is partial
    with pytest.raises(AssertionError, match="2 owners but no name"):
        bm.assert_invariants([a, b])
    c = make_seq(list(range(6)), "c")
    admit(bm, c)
    compute(bm, c)
    c.num_computed_tokens = 2  # as if c would write again into its named block 0
    with pytest.raises(AssertionError, match="may write into named block"):
        bm.assert_invariants([c])
