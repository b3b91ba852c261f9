"""The scheduler with prefix caching: admission after a hit, n choices, preemption, and a random
state machine over shared prefixes, salts, choices and aborts (the harness checks K/V content)."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import rule

from tests.engine.sched_helpers import SAMPLED_TOKEN, Harness, HarnessMachine


def test_admission_starts_after_the_cached_prefix() -> None:
    h = Harness(num_blocks=16, block_size=4, max_seqs=4, max_tokens=64, prefix_caching=True)
    (a,) = h.add_tokens([*range(1, 11)], max_tokens=3)
    h.step()
    (b,) = h.add_tokens([*range(1, 10), 50, 51], max_tokens=3)
    out = h.step()
    item = next(s for s in out.scheduled if s.seq_id == b.seq_id)
    assert (item.num_computed_tokens, item.token_ids) == (8, (9, 50, 51))
    assert b.block_ids[:2] == a.block_ids[:2] and b.num_cached_tokens == 8
    assert h.scheduler.num_prompt_tokens_computed == 10 + 3


def test_n_choices_compute_the_prompt_once_and_share_its_full_blocks() -> None:
    h = Harness(num_blocks=16, block_size=4, max_seqs=4, max_tokens=64, prefix_caching=True)
    leader, *forks = h.add_tokens([*range(1, 11)], max_tokens=3, n=3)
    out = h.step()  # the forks wait for the first choice's prompt
    assert [s.seq_id for s in out.scheduled] == [leader.seq_id]
    assert list(h.scheduler.waiting) == forks  # released to the front after the prompt
    out = h.step()
    assert [(s.seq_id, s.num_scheduled_tokens) for s in out.scheduled] == [
        (leader.seq_id, 1),
        (forks[0].seq_id, 2),
        (forks[1].seq_id, 2),
    ]
    assert [s.block_ids for s in (leader, *forks)] == [(0, 1, 2), (0, 1, 3), (0, 1, 4)]
    assert h.bm.ref_counts[:2] == [3, 3]
    assert h.scheduler.num_prompt_tokens_computed == 10 + 2 + 2
    assert [f.num_cached_tokens for f in forks] == [8, 8]
    while h.seqs:
        h.step()
    assert h.bm.num_free_blocks == 16


def test_n_choices_without_caching_all_queue_at_once() -> None:
    h = Harness(num_blocks=16, block_size=4, max_seqs=4, max_tokens=64)
    seqs = h.add_tokens([*range(1, 11)], max_tokens=2, n=3)
    out = h.step()
    assert [s.seq_id for s in out.scheduled] == [s.seq_id for s in seqs]
    assert h.scheduler.num_prompt_tokens_computed == 30


def test_aborting_a_request_drops_forks_still_held() -> None:
    h = Harness(num_blocks=16, block_size=4, max_seqs=4, max_tokens=8, prefix_caching=True)
    leader, *_ = h.add_tokens([*range(1, 11)], max_tokens=2, n=3)
    h.step()  # 8 of 10 prompt tokens: the forks are still held
    assert h.scheduler.num_unfinished == 3
    h.abort(leader.request_id)
    assert h.scheduler.num_unfinished == 0 and not h.scheduler.waiting
    assert h.bm.num_free_blocks == 16
    h.bm.assert_invariants([])


def test_preempted_recompute_hits_its_own_cached_blocks_with_exact_ids() -> None:
    h = Harness(num_blocks=5, block_size=2, max_seqs=4, max_tokens=16, prefix_caching=True)
    (a,) = h.add_tokens([1, 2, 3], max_tokens=6)
    (b,) = h.add_tokens([11, 12, 13], max_tokens=6)
    h.step()  # a: blocks 0, 1; b: blocks 2, 3
    h.step()
    out = h.step()  # a needs a third block: b, admitted last, is preempted
    assert out.preempted_ids == (b.request_id,)
    assert h.bm.prefix_cache is not None and h.bm.prefix_cache.parked() == [3, 2]  # tail first
    for _ in range(3):  # a grows into b's tail block 3 (evicted) and finishes
        h.step()
    assert a.is_finished and h.bm.prefix_cache.parked() == [2, 3, 4, 1, 0]
    out = h.step()
    # b's head block 2 survived: 2 of its 5 tokens are cached; the fresh blocks evict the least
    # recently freed, a's tail (3, 4), so a's head (1, 0) stays cached.
    (item,) = out.scheduled
    assert (item.seq_id, item.num_computed_tokens, item.block_ids) == (b.seq_id, 2, (2, 3, 4))
    assert h.bm.prefix_cache.parked() == [1, 0]
    stats = h.bm.cache_stats()
    assert (stats.num_query_tokens, stats.num_hit_tokens, stats.num_evictions) == (11, 2, 3)
    assert b.num_cached_tokens == 0  # counted at first admission only
    while h.seqs:
        h.step()
    assert a.output_token_ids == b.output_token_ids == [SAMPLED_TOKEN] * 6


BASES = ([*range(100, 120)], [*range(100, 108), *range(200, 212)], [*range(300, 320)])


class PrefixCacheMachine(HarnessMachine):
    """Shared prefixes of every length, salts, n choices, preemption and aborts: no block leaked
    or double-owned, no write into a shared block, every sequence attends to its own prefix."""

    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(
            num_blocks=14, block_size=4, max_seqs=4, max_tokens=10, prefix_caching=True
        )
        self.fresh = 1000  # suffix tokens no other prompt has

    @rule(
        base=st.sampled_from(BASES),
        prefix_len=st.integers(0, 14),
        suffix_len=st.integers(0, 5),
        salt=st.sampled_from([None, "a", "b"]),
        n=st.integers(1, 3),
        max_tokens=st.integers(1, 8),
    )
    def add(
        self,
        base: list[int],
        prefix_len: int,
        suffix_len: int,
        salt: str | None,
        n: int,
        max_tokens: int,
    ) -> None:
        suffix = list(range(self.fresh, self.fresh + max(suffix_len, prefix_len == 0)))
        self.fresh += len(suffix)
        self.h.add_tokens(base[:prefix_len] + suffix, max_tokens, salt=salt, n=n)

    def check_end(self) -> None:
        stats = self.h.bm.cache_stats()
        assert stats.num_cached_free_blocks == stats.num_cached_blocks  # all parked


TestPrefixCacheMachine = PrefixCacheMachine.TestCase
TestPrefixCacheMachine.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
