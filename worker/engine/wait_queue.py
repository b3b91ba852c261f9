"""The waiting queue: ordered by priority, then tenant fair share, then arrival.

Lower priority numbers are more urgent (vLLM's and Celery's convention). Within one priority the
next sequence comes from the tenant whose virtual counter (``FairShare``) is smallest, and within
one tenant in arrival order. A preempted sequence goes back under its original arrival index, so
it keeps its place among its own priority instead of queueing behind later arrivals; a request's
other choices (n > 1) share its arrival index and so sit right behind it.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterator

from worker.engine.fair_share import FairShare
from worker.engine.sequence import Sequence


def _order(seq: Sequence) -> tuple[int, int]:
    return (seq.arrival_index, seq.index)


class WaitQueue:
    def __init__(self, fair_share: FairShare) -> None:
        self.fair_share = fair_share
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
        """The sequence to admit next: most urgent priority, then the least-served tenant (ties
        to the earliest arrival), skipping tenants in ``skip_tenants`` (at their running cap)."""
        for priority in sorted(self._bands):
            heads = [q[0] for t, q in self._bands[priority].items() if t not in skip_tenants]
            if heads:
                counter = self.fair_share.counter
                return min(heads, key=lambda s: (counter(s.tenant), _order(s)))
        return None

    def most_urgent_priority(self) -> int | None:
        return min(self._bands) if self._bands else None

    def __iter__(self) -> Iterator[Sequence]:
        """Every waiting sequence in admission order as of now (counters frozen)."""
        counter = self.fair_share.counter
        for priority in sorted(self._bands):
            tenants = self._bands[priority]
            merged = [s for queue in tenants.values() for s in queue]
            yield from sorted(merged, key=lambda s: (counter(s.tenant), _order(s)))

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
