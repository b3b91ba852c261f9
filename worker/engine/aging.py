"""Aging: a job's effective priority improves with the time since it was submitted.

Strict priority starves: under an unbroken stream of interactive jobs a batch job never starts.
With aging, a job's effective priority is its priority less ``rate_per_s`` for every second since
its submission (``EngineRequest.arrival_time``: its wait in Redis, in the worker's inbox and
while its constraint compiles all count), never past
``MIN_PRIORITY`` (the most urgent a client may ask): ``effective_priority``, the one rule, used
here and by the worker's band reader (``worker/service/bands.py``) on the heads of the Redis
streams. Every job ages at the same rate from its own submission, so the order of two jobs
never changes while both are unclamped: of two jobs submitted together the more urgent still
goes first, and a batch job (10) goes before interactive jobs (-10) submitted more than
20 / rate_per_s seconds after it. Ties (two clamped jobs) go to the more urgent priority.

Running jobs keep aging, and preemption compares the same effective priorities (``key``). So
the order of any two jobs is fixed, except once, when the second of them reaches the clamp:
a job that preempted another cannot later be preempted back by it (no ping-pong).

Aging orders the priority levels; within one priority, tenant fair share still decides.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from producer.protocol import MIN_PRIORITY
from worker.engine.sequence import Sequence

Clock = Callable[[], float]


def effective_priority(priority: int, waited_s: float, rate_per_s: float) -> float:
    """``priority`` less ``rate_per_s`` a second of ``waited_s``, clamped at ``MIN_PRIORITY``;
    rate 0: aging off, the plain priority."""
    if rate_per_s == 0:
        return float(priority)
    return max(float(MIN_PRIORITY), priority - rate_per_s * max(0.0, waited_s))


def aging_key(priority: int, waited_s: float, rate_per_s: float) -> tuple[float, int]:
    """Sort key, smallest most urgent: effective priority, ties to the priority."""
    return (effective_priority(priority, waited_s, rate_per_s), priority)


class Aging:
    """Effective priorities at the time of the step being scheduled (``tick``)."""

    def __init__(self, rate_per_s: float, clock: Clock = time.monotonic) -> None:
        self.rate_per_s = rate_per_s  # 0: off, the plain priority order
        self.clock = clock
        self.now = clock()
        self._arrived_s: dict[int, float] = {}  # by sequence id

    def tick(self) -> None:
        """Read the clock once per step: every decision of one step sees the same ages."""
        self.now = self.clock()

    def arrive(self, seq: Sequence, arrival_s: float | None = None) -> None:
        """``seq`` reached the scheduler; it was submitted at ``arrival_s`` on ``clock``
        (None: now). A second call keeps the first arrival."""
        self._arrived_s.setdefault(seq.seq_id, self.clock() if arrival_s is None else arrival_s)

    def forget(self, seq: Sequence) -> None:
        self._arrived_s.pop(seq.seq_id, None)

    def age_s(self, seq: Sequence) -> float:
        return max(0.0, self.now - self._arrived_s.get(seq.seq_id, self.now))

    def effective(self, seq: Sequence) -> float:
        """``seq``'s priority less its aging, clamped at ``MIN_PRIORITY``."""
        return effective_priority(seq.priority, self.age_s(seq), self.rate_per_s)

    def key(self, seq: Sequence) -> tuple[float, int]:
        """Sort key, smallest most urgent (``aging_key``)."""
        return aging_key(seq.priority, self.age_s(seq), self.rate_per_s)

    def outranks(self, a: Sequence, b: Sequence) -> bool:
        """``a`` may preempt ``b``: another priority, and strictly more urgent now. Within one
        priority nothing preempts (tenant fair share orders it)."""
        return a.priority != b.priority and self.key(a) < self.key(b)
