"""The paged KV pool's bookkeeping: which block belongs to which sequence.

Blocks are fixed-size runs of ``block_size`` token slots in one preallocated pool; a sequence's
block table grows a block at a time as its computed tokens grow. Ref counts are kept per block so
prefix sharing can hand one block to several sequences; today each block has one owner.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

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
    """Paired check/act methods: ``can_allocate``/``allocate``; ``free`` returns blocks at once."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        """Blocks ``seq`` must gain to hold ``num_new_tokens`` past its computed tokens."""
        needed = self.blocks_for(seq.num_computed_tokens + num_new_tokens)
        return max(0, needed - len(seq.block_ids))

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.num_new_blocks(seq, num_new_tokens) <= len(self._free)

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Grow ``seq``'s block table so ``num_new_tokens`` more tokens have slots."""
        count = self.num_new_blocks(seq, num_new_tokens)
        if count > len(self._free):
            raise RuntimeError(
                f"allocate without can_allocate: need {count}, have {len(self._free)}"
            )
        for _ in range(count):
            block_id = self._free.popleft()
            self.ref_counts[block_id] = 1
            seq.block_ids.append(block_id)

    def free(self, seq: Sequence) -> None:
        """Return all of ``seq``'s blocks (finish, abort or preemption)."""
        # Tail first, so the head of the sequence is the last of its blocks to be reused: the
        # order prefix caching will want (a prompt's head is the part other requests share).
        for block_id in reversed(seq.block_ids):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self._free.append(block_id)
        seq.block_ids = []

    def usage(self, seqs: Iterable[Sequence]) -> CacheUsage:
        used_slots = 0
        token_slots = 0
        for seq in seqs:
            used_slots += len(seq.block_ids) * self.block_size
            token_slots += min(seq.num_tokens, len(seq.block_ids) * self.block_size)
        return CacheUsage(
            num_blocks=self.num_blocks,
            num_used_blocks=self.num_blocks - len(self._free),
            num_used_slots=used_slots,
            num_token_slots=token_slots,
        )

    def assert_invariants(self, seqs: Iterable[Sequence]) -> None:
        """No block owned twice or both owned and free; free + used = total; refs match owners."""
        owners = [0] * self.num_blocks
        for seq in seqs:
            for block_id in seq.block_ids:
                owners[block_id] += 1
            assert len(seq.block_ids) >= self.blocks_for(seq.num_computed_tokens), seq
        free = set(self._free)
        assert len(free) == len(self._free), "a block is on the free list twice"
        for block_id in range(self.num_blocks):
            if owners[block_id] == 0:
                assert block_id in free, f"block {block_id} leaked: no owner, not free"
            else:
                assert block_id not in free, f"block {block_id} is owned and free"
            assert owners[block_id] == self.ref_counts[block_id], (
                f"block {block_id}: {owners[block_id]} owners, "
                f"ref count {self.ref_counts[block_id]}"
            )
        assert len(free) + sum(1 for o in owners if o) == self.num_blocks
