"""Automatic prefix caching: full KV blocks found again by the tokens they hold.

A full block is named by a digest chained over its parent block's digest, its token ids and the
request's cache salt, so block i's digest stands for the whole prefix up to its end: two sequences
reach the same digest at block i only if their first ``(i + 1) * block_size`` tokens and their
salts are the same. blake2b, unlike ``hash()``, gives the same digest in every process, so names
could later be compared across workers.

A hit is checked against the block's stored key (parent digest, token ids, salt), so two keys
that land on one digest never share K/V; a wrong hit would need two different prefixes with equal
256-bit chained digests.

Cached blocks whose ref count falls to 0 stay named, in a least-recently-freed queue: a hit takes
one back; the pool evicts the oldest (forgets its name) only when it needs a fresh block and no
unnamed free block is left.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from worker.engine.sequence import Sequence

BlockKey = tuple[bytes, tuple[int, ...], str | None]  # parent digest, token ids, salt

_DIGEST_BYTES = 32
_ROOT = bytes(_DIGEST_BYTES)  # the parent digest of a sequence's first block


def block_digest(parent: bytes, token_ids: Seq[int], salt: str | None) -> bytes:
    """The chained name of one full block; fixed-width fields so no two inputs run together."""
    salt_bytes = b"" if salt is None else salt.encode()
    h = hashlib.blake2b(parent, digest_size=_DIGEST_BYTES)
    h.update(struct.pack("<?I", salt is not None, len(salt_bytes)))  # None and "" differ
    h.update(salt_bytes)
    h.update(struct.pack(f"<{len(token_ids)}I", *token_ids))
    return h.digest()


@dataclass(frozen=True)
class PrefixHit:
    """Cached blocks a sequence without blocks can start from, in table order."""

    block_ids: tuple[int, ...] = ()
    num_tokens: int = 0  # tokens they hold: the sequence's num_computed_tokens once taken
    num_free: int = 0  # of the blocks, how many have no owner (taking them shrinks the free pool)


NO_HIT = PrefixHit()


@dataclass(frozen=True)
class PrefixCacheStats:
    num_query_tokens: int  # tokens of every sequence admitted (re-admissions included)
    num_hit_tokens: int  # of those, tokens found in the cache rather than computed
    num_cached_blocks: int  # named blocks, owned or free
    num_cached_free_blocks: int  # of those, with no owner: reusable until evicted
    num_evictions: int  # named free blocks whose name was dropped to serve as fresh blocks

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_query_tokens if self.num_query_tokens else 0.0


class PrefixCache:
    """Names of full blocks, and the queue of named blocks nobody owns (oldest first)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._blocks: dict[bytes, int] = {}  # digest -> block id
        self._keys: dict[int, tuple[bytes, BlockKey]] = {}  # block id -> its digest and key
        self._free: OrderedDict[int, None] = OrderedDict()  # named, ref count 0; oldest first
        self._num_query_tokens = 0
        self._num_hit_tokens = 0
        self._num_evictions = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    def parked(self) -> list[int]:
        """Named blocks nobody owns, least recently freed (next to be evicted) first."""
        return list(self._free)

    def is_cached(self, block_id: int) -> bool:
        return block_id in self._keys

    def lookup(self, seq: Sequence) -> PrefixHit:
        """The longest run of cached blocks that starts ``seq``'s tokens."""
        # At least one token must be computed so the step has logits to sample from. When every
        # token sits in cached full blocks, the last of them is not taken and its block_size
        # tokens are recomputed into a fresh block: one block of work (16 tokens by default),
        # where reusing it would mean writing the last token's K/V into a shared block, i.e.
        # copy-on-write of device memory the scheduler never touches.
        max_blocks = (seq.num_tokens - 1) // self.block_size
        block_ids: list[int] = []
        for i in range(max_blocks):
            block_id = self._blocks.get(self._digest(seq, i))
            if block_id is None or self._keys[block_id][1] != self._key(seq, i):
                break
            block_ids.append(block_id)
        num_free = sum(1 for b in block_ids if b in self._free)
        return PrefixHit(tuple(block_ids), len(block_ids) * self.block_size, num_free)

    def record_admission(self, num_tokens: int, hit: PrefixHit) -> None:
        self._num_query_tokens += num_tokens
        self._num_hit_tokens += hit.num_tokens

    def register(self, seq: Sequence, first_block: int) -> None:
        """Name ``seq``'s blocks from ``first_block`` on that are full of computed tokens."""
        for i in range(first_block, seq.num_computed_tokens // self.block_size):
            digest = self._digest(seq, i)
            block_id = seq.block_ids[i]
            # Taken: two sequences admitted in one step computed the same prefix (the first to
            # finish a block keeps the name; the copy stays unnamed) or, far less likely, a
            # different key has this digest. Either way this block is simply not shared.
            if digest in self._blocks or block_id in self._keys:
                continue
            self._blocks[digest] = block_id
            self._keys[block_id] = (digest, self._key(seq, i))

    def park(self, block_id: int) -> None:
        """A named block lost its last owner: it joins the queue as the most recently freed."""
        self._free[block_id] = None

    def take(self, block_id: int) -> None:
        """A hit on a parked block: it leaves the queue (its ref count goes 0 -> 1)."""
        del self._free[block_id]

    def evict(self) -> int:
        """Forget the least recently freed named block's name and hand it out as fresh."""
        block_id, _ = self._free.popitem(last=False)
        digest, _ = self._keys.pop(block_id)
        del self._blocks[digest]
        self._num_evictions += 1
        return block_id

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(
            num_query_tokens=self._num_query_tokens,
            num_hit_tokens=self._num_hit_tokens,
            num_cached_blocks=len(self._keys),
            num_cached_free_blocks=len(self._free),
            num_evictions=self._num_evictions,
        )

    def assert_invariants(self, ref_counts: Seq[int]) -> None:
        """Names and blocks map one to one; a named block is parked exactly when unowned."""
        assert len(self._blocks) == len(self._keys)
        for digest, block_id in self._blocks.items():
            assert self._keys[block_id][0] == digest, f"block {block_id} has two names"
        for block_id in self._keys:
            parked = block_id in self._free
            assert parked == (ref_counts[block_id] == 0), (
                f"named block {block_id}: ref count {ref_counts[block_id]}, parked {parked}"
            )
        assert all(b in self._keys for b in self._free), "an unnamed block is parked"

    # -- names -----------------------------------------------------------------------------------

    def _digest(self, seq: Sequence, i: int) -> bytes:
        """Block ``i``'s digest, memoised on ``seq`` (a block's tokens never change once full)."""
        memo = seq.block_digests
        bs = self.block_size
        for j in range(len(memo), i + 1):
            parent = memo[j - 1] if j else _ROOT
            memo.append(block_digest(parent, seq.token_ids[j * bs : (j + 1) * bs], seq.cache_salt))
        return memo[i]

    def _key(self, seq: Sequence, i: int) -> BlockKey:
        parent = seq.block_digests[i - 1] if i else _ROOT
        bs = self.block_size
        return parent, tuple(seq.token_ids[i * bs : (i + 1) * bs]), seq.cache_salt
