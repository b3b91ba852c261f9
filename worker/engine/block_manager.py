"""The paged KV pool's bookkeeping: which block belongs to which sequence.

Blocks are fixed-size runs of ``block_size`` token slots in one preallocated pool; a sequence's
block table grows a block at a time as its computed tokens grow. Ref counts are kept per block:
with prefix caching a full block can sit in several tables at once (requests sharing a prefix).

Only full, named blocks (see `PrefixCache`) are ever shared, and a sequence writes only past its
``num_computed_tokens``, which lie beyond its named blocks; so no sequence writes into a block
another one reads, and copy-on-write is never needed. `assert_invariants` checks this.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass

from worker.engine.prefix_cache import NO_HIT, PrefixCache, PrefixCacheStats, PrefixHit
from worker.engine.sequence import Sequence


@dataclass(frozen=True)
class CacheUsage:
    """Numbers the worker exports; ``waste`` counts allocated slots that hold no token."""

    num_blocks: int
    num_used_blocks: int
    num_used_slots: int  # slots allocated to sequences
    num_token_slots: int  # of those, slots holding a computed or about-to-be-computed token

    @property
    def utilisation(self) -> float:
        return self.num_used_blocks / self.num_blocks if self.num_blocks else 0.0

    @property
    def waste_slots(self) -> int:
        return self.num_used_slots - self.num_token_slots

    @property
    def waste_fraction(self) -> float:
        return self.waste_slots / self.num_used_slots if self.num_used_slots else 0.0


class BlockManager:
    """Paired check/act methods: ``lookup``, ``can_allocate``/``allocate``; ``free`` at once.

    Free blocks live in two queues: unnamed ones (never used, or partly filled) are handed out
    first; named ones stay cached until a fresh block is needed and none unnamed is left.
    """

    def __init__(
        self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = False
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))  # unnamed free blocks, oldest first
        self.prefix_cache = PrefixCache(block_size) if enable_prefix_caching else None

    @property
    def num_free_blocks(self) -> int:
        cached = self.prefix_cache.num_free if self.prefix_cache is not None else 0
        return len(self._free) + cached

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        """Blocks ``seq`` must gain to hold ``num_new_tokens`` past its computed tokens."""
        needed = self.blocks_for(seq.num_computed_tokens + num_new_tokens)
        return max(0, needed - len(seq.block_ids))

    def has_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether ``seq``'s blocks already hold ``num_new_tokens`` more tokens: then
        `allocate` has nothing to do and `can_allocate` is true."""
        held = len(seq.block_ids) * self.block_size
        return held > 0 and seq.num_computed_tokens + num_new_tokens <= held

    def lookup(self, seq: Sequence) -> PrefixHit:
        """Cached blocks a sequence without blocks could start from; `NO_HIT` if caching is off.
        Valid until the pool next changes: pass it straight to `can_allocate` and `allocate`."""
        if self.prefix_cache is None or seq.block_ids:
            return NO_HIT
        return self.prefix_cache.lookup(seq)

    def can_allocate(self, seq: Sequence, num_new_tokens: int, hit: PrefixHit = NO_HIT) -> bool:
        """Whether ``seq`` can take ``hit`` and then slots for ``num_new_tokens`` more tokens."""
        return self.num_needed(seq, num_new_tokens, hit) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int, hit: PrefixHit = NO_HIT) -> None:
        """Take ``hit`` (its tokens count as computed), then grow ``seq``'s block table so
        ``num_new_tokens`` more tokens have slots."""
        needed = self.num_needed(seq, num_new_tokens, hit)
        if needed > self.num_free_blocks:
            raise RuntimeError(
                f"allocate without can_allocate: need {needed}, have {self.num_free_blocks}"
            )
        if self.prefix_cache is not None and not seq.block_ids:
            self.prefix_cache.record_admission(seq.num_tokens, hit)
        if hit.block_ids:
            self._take_hit(seq, hit)
        fresh = []
        for _ in range(self.num_new_blocks(seq, num_new_tokens)):
            block_id = self._free.popleft() if self._free else self._evict()
            self.ref_counts[block_id] = 1
            fresh.append(block_id)
        if fresh:  # a new tuple: the steps already built keep the table they were given
            seq.block_ids += tuple(fresh)

    def cache_full_blocks(self, seq: Sequence, num_computed_before: int) -> None:
        """After a step: name the blocks ``seq`` filled with computed tokens in it."""
        cache, first = self.prefix_cache, num_computed_before // self.block_size
        if cache is not None and seq.num_computed_tokens // self.block_size > first:
            cache.register(seq, first)

    def free(self, seq: Sequence) -> None:
        """Return all of ``seq``'s blocks (finish, abort or preemption); shared ones stay."""
        # Tail first: the head of a sequence is the part other requests share, so among its
        # cached blocks the head is the last to be evicted.
        for block_id in reversed(seq.block_ids):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] > 0:
                continue
            if self.prefix_cache is not None and self.prefix_cache.is_cached(block_id):
                self.prefix_cache.park(block_id)
            else:
                self._free.append(block_id)
        seq.block_ids = ()

    def cache_stats(self) -> PrefixCacheStats:
        if self.prefix_cache is None:
            return PrefixCacheStats(0, 0, 0, 0, 0)
        return self.prefix_cache.stats()

    def num_reclaimable(self, seqs: Iterable[Sequence]) -> int:
        """Blocks that freeing all of ``seqs`` would return: those no other sequence holds."""
        held = Counter(b for seq in seqs for b in seq.block_ids)
        return sum(1 for b, n in held.items() if self.ref_counts[b] == n)

    def num_needed(self, seq: Sequence, num_new_tokens: int, hit: PrefixHit = NO_HIT) -> int:
        """Free blocks ``allocate`` would use: fresh ones plus the unowned blocks of ``hit``."""
        if not hit.block_ids:
            return self.num_new_blocks(seq, num_new_tokens)
        if seq.block_ids:
            raise ValueError(f"a prefix hit is only for a sequence without blocks: {seq}")
        fresh = self.blocks_for(hit.num_tokens + num_new_tokens) - len(hit.block_ids)
        return fresh + hit.num_free

    def _take_hit(self, seq: Sequence, hit: PrefixHit) -> None:
        assert self.prefix_cache is not None
        for block_id in hit.block_ids:
            if self.ref_counts[block_id] == 0:
                self.prefix_cache.take(block_id)
            self.ref_counts[block_id] += 1
        seq.block_ids = hit.block_ids
        seq.num_computed_tokens = hit.num_tokens

    def _evict(self) -> int:
        if self.prefix_cache is None or not self.prefix_cache.num_free:
            raise RuntimeError("no free block")
        return self.prefix_cache.evict()

    def usage(self, seqs: Iterable[Sequence]) -> CacheUsage:
        used_slots = 0
        token_slots = 0
        for seq in seqs:
            used_slots += len(seq.block_ids) * self.block_size
            token_slots += min(seq.num_tokens, len(seq.block_ids) * self.block_size)
        return CacheUsage(
            num_blocks=self.num_blocks,
            num_used_blocks=self.num_blocks - self.num_free_blocks,
            num_used_slots=used_slots,
            num_token_slots=token_slots,
        )

    def assert_invariants(self, seqs: Iterable[Sequence]) -> None:
        """No block owned twice or both owned and free; free + used = total; refs match owners;
        a shared block is named, and a named block is never written (copy-on-write not needed)."""
        cache = self.prefix_cache
        owners = [0] * self.num_blocks
        for seq in seqs:
            for i, block_id in enumerate(seq.block_ids):
                owners[block_id] += 1
                named = cache is not None and cache.is_cached(block_id)
                # Writes go to positions >= num_computed_tokens: a named block must lie below.
                assert not named or (i + 1) * self.block_size <= seq.num_computed_tokens, (
                    f"{seq} may write into named block {block_id}"
                )
            assert len(seq.block_ids) >= self.blocks_for(seq.num_computed_tokens), seq
        free_list = list(self._free) + (cache.parked() if cache is not None else [])
        free = set(free_list)
        assert len(free) == len(free_list), "a block is on the free lists twice"
        for block_id in range(self.num_blocks):
            if owners[block_id] == 0:
                assert block_id in free, f"block {block_id} leaked: no owner, not free"
            else:
                assert block_id not in free, f"block {block_id} is owned and free"
            assert owners[block_id] == self.ref_counts[block_id], (
                f"block {block_id}: {owners[block_id]} owners, "
                f"ref count {self.ref_counts[block_id]}"
            )
            if owners[block_id] > 1:
                assert cache is not None and cache.is_cached(block_id), (
                    f"block {block_id} has {owners[block_id]} owners but no name"
                )
        assert len(free) + sum(1 for o in owners if o) == self.num_blocks
        if cache is not None:
            cache.assert_invariants(self.ref_counts)
