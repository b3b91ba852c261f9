"""The waiting queue: ordered by effective priority, then tenant fair share, then arrival.

Lower priority numbers are more urgent (vLLM's and Celery's convention). The priority levels
are ordered by the effective priority of each level's next sequence (``Aging``: with aging off,
the plain priority; with it on, a level's next sequence ages with its wait). Within one priority the
next sequence comes from the tenant whose virtual counter (``FairShare``) is smallest, and within
one tenant in arrival order. A preempted sequence goes back under its original arrival index, so
it keeps its place among its own priority instead of queueing behind later arrivals; a request's
other choices (n > 1) share its arrival index and so sit right behind it.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Collection, Iterator

from worker.engine.aging import Aging
from worker.engine.fair_share import FairShare
from worker.engine.sequence import Sequence


def _order(seq: Sequence) -> tuple[int, int]:
    return (seq.arrival_index, seq.index)


class WaitQueue:
    def __init__(self, fair_share: FairShare, aging: Aging) -> None:
        self.fair_share = fair_share
        self.aging = aging
        # priority -> tenant -> that tenant's sequences, sorted by (arrival, choice index)
        self._bands: dict[int, dict[str, list[Sequence]]] = {}
        self._len = 0

    def add(self, seq: Sequence) -> None:
        tenants = self._bands.setdefault(seq.priority, {})
        bisect.insort(tenants.setdefault(seq.tenant, []), seq, key=_order)
        self._len += 1

    def remove(self, seq: Sequence) -> None:
        tenants = self._bands[seq.priority]
        queue = tenants[seq.tenant]
        queue.remove(seq)
        self._len -= 1
        if not queue:
            del tenants[seq.tenant]
            if not tenants:
                del self._bands[seq.priority]

    def head(self, skip_tenants: Collection[str] = ()) -> Sequence | None:
        """The sequence to admit next: of each priority's least-served tenant's first sequence
        (ties to the earliest arrival), skipping tenants in ``skip_tenants`` (at their running
        cap), the one of the most urgent effective priority (``Aging.key``)."""
        counter = self.fair_share.counter
        heads = []
        for tenants in self._bands.values():
            firsts = [q[0] for t, q in tenants.items() if t not in skip_tenants]
            if firsts:
                heads.append(min(firsts, key=lambda s: (counter(s.tenant), _order(s))))
        return min(heads, key=self.aging.key) if heads else None

    def has_priority_from(self, floor: int) -> bool:
        """Whether a sequence of priority ``floor`` or less urgent waits (a few keys: cheap)."""
        return any(priority >= floor for priority in self._bands)

    def __iter__(self) -> Iterator[Sequence]:
        """Every waiting sequence in admission order as of now (counters and ages frozen):
        each priority's sequences in fair-share order, merged as ``head`` picks them."""
        counter = self.fair_share.counter
        levels = []
        for tenants in self._bands.values():
            merged = [s for queue in tenants.values() for s in queue]
            levels.append(sorted(merged, key=lambda s: (counter(s.tenant), _order(s))))
        # heapq.merge yields the smallest of the levels' current heads, as head() does.
        yield from heapq.merge(*levels, key=self.aging.key)

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __contains__(self, seq: object) -> bool:
        if not isinstance(seq, Sequence):
            return False
        queue = self._bands.get(seq.priority, {}).get(seq.tenant, [])
        i = bisect.bisect_left(queue, _order(seq), key=_order)
        return any(s is seq for s in queue[i : i + 1])
