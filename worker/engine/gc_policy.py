"""The garbage collector's young-generation threshold, for a process that steps an engine.

A decode step builds a few objects per request (its `ScheduledSequence`, token and block-table
tuples, its `RequestOutput`) and reference counting frees nearly all of them within the step or
the next, yet the net count of new container objects crossed CPython's default threshold (700)
about once a step at batch 256: `ops/bench/host_overhead.py --batches 256` counted 35 young and
3 middle collections over ~40 steps, 0.13 ms of CPU a step (``time.thread_time`` in
``gc.callbacks``), all of it on the critical path. With 10,000 none ran in those steps. Cyclic
garbage then waits a little longer to be found: at most 10,000 objects more.
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 10_000


def raise_gen0_threshold() -> None:
    """Raise the youngest generation's threshold to `GEN0_THRESHOLD`; never lower it, and leave
    a collector switched off by a threshold of 0 as it is (it is process-wide)."""
    gen0, gen1, gen2 = gc.get_threshold()
    if 0 < gen0 < GEN0_THRESHOLD:
        gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
