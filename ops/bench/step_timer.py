"""Timing an `LLMEngine.step` by phase from outside the engine, on whichever thread a phase runs.

`host_overhead.py` wraps the engine's parts (the scheduler's ``schedule`` and ``update``, the
runner's ``prepare`` and ``run``, the sampler, `RequestState.append`/``emit`` and the
detokenizer) and times each call. The plain loop runs them all on the calling thread. The
overlapped loop's ``thread`` mode runs prepare, forward and sampling on its step thread: those
phases are kept per computed step and joined to the call that waited for that step's ids, and
the step thread's idle time between two computes is recorded (``device_idle``): the host work
the compute waited for, measured where it waits.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ParamSpec, TypeVar

from worker.engine.detokenizer import IncrementalDetokenizer
from worker.engine.llm_engine import LLMEngine
from worker.engine.overlap import OverlapLoop
from worker.engine.request_state import RequestState
from worker.engine.sampler import Sampler
from worker.engine.step_launch import InFlight

P = ParamSpec("P")
R = TypeVar("R")
# Phases of the calling thread that add up to its step; "run" holds "prepare" (and on the
# calling thread, in the plain loop, the forward). "detokenize" is part of "append".
CALLER_PHASES = ("schedule", "run", "sample", "update", "append", "resolve", "wait")


class StepTimer:
    """Seconds per phase of the step in progress, and of every finished one."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        # ``time.thread_time``: each phase's CPU time on the thread it runs on, which other
        # processes' load on a shared machine hardly moves (wall time there varies 2-10x).
        self.clock = clock
        self.caller = threading.get_ident()  # the thread that calls `LLMEngine.step`
        self.current: dict[str, float] = {}
        self.steps: list[dict[str, float]] = []
        self._computing: dict[str, float] = {}  # the step thread's compute in progress
        self._computed: deque[dict[str, float]] = deque()  # its finished computes, oldest first
        self._last_end: float | None = None
        self._active: set[tuple[int, str]] = set()  # (thread, phase) being timed: not twice

    def timed(self, phase: str, fn: Callable[P, R]) -> Callable[P, R]:
        """``fn`` timed as ``phase``; a call inside another of the same phase is not counted."""

        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            key = (threading.get_ident(), phase)
            if key in self._active:
                return fn(*args, **kwargs)
            self._active.add(key)
            start = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = self.clock() - start
                self._active.discard(key)
                acc = self.current if key[0] == self.caller else self._computing
                acc[phase] = acc.get(phase, 0.0) + elapsed

        return wrapper

    def computes(self, fn: Callable[P, R]) -> Callable[P, R]:
        """``fn``, the step thread's whole compute of one step, with its idle time before."""

        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            start = time.perf_counter()
            idle = 0.0 if self._last_end is None else start - self._last_end
            try:
                return fn(*args, **kwargs)
            finally:
                self._last_end = time.perf_counter()
                phases, self._computing = self._computing, {}
                phases["device_idle"] = idle
                self._computed.append(phases)

        return wrapper

    def end_step(self, step_s: float, keep: bool) -> None:
        """Close the step (``step_s`` of the caller's wall time); keep its phases if ``keep``.
        A step computed on the step thread is the one this call waited for."""
        phases, self.current = self.current, {}
        computed = self._computed.popleft() if self._computed else {}
        if not keep:
            return
        on_caller = sum(phases.get(k, 0.0) for k in CALLER_PHASES)
        for key, value in computed.items():
            phases[key] = phases.get(key, 0.0) + value
        phases["forward"] = phases.get("run", 0.0) - phases.get("prepare", 0.0)
        phases["other"] = step_s - on_caller
        phases["step"] = step_s
        self.steps.append(phases)


# The wrappers called once per request per step. Each costs the clock twice: 1.04 us a call
# of `time.thread_time` (a system call) on a 2-core AMD EPYC, 0.06 of `time.perf_counter`, so
# at batch 256 these alone add ~1 ms of thread time to the step they time (2 a row).
PER_ROW_PARTS = (
    (RequestState, "append", "append"),
    (RequestState, "emit", "append"),  # the overlapped loop's (inside append in the plain)
    (IncrementalDetokenizer, "add_tokens", "detokenize"),
)


@contextmanager
def instrumented(engine: LLMEngine, timer: StepTimer, per_row: bool = True) -> Iterator[None]:
    """Wrap the engine's parts until exit: attributes of its own instances, and, with
    ``per_row``, the methods of the per-request classes (`PER_ROW_PARTS`); without them their
    time is in ``other`` and the step is timed at its true length."""
    parts: list[tuple[object, str, str]] = [
        (engine.scheduler, "schedule", "schedule"),
        (engine.scheduler, "update", "update"),
        (engine.runner, "prepare", "prepare"),
        (engine.runner, "run", "run"),
        (Sampler, "__call__", "sample"),  # the plain loop's and the step thread's
        # The async launch's (inside __call__ otherwise); the instance's: a stub replaces it there.
        (engine.sampler, "sample_ids", "sample"),
        (InFlight, "result", "wait"),  # for the step thread; on the CPU's async, a tolist
        (OverlapLoop, "_resolve", "resolve"),  # tokens joined and length/EOS ends, pre-launch
    ]
    if per_row:
        parts += PER_ROW_PARTS
    loop = engine._overlap
    originals = [getattr(obj, attr) for obj, attr, _ in parts]
    # An instance's method comes from its class: on exit the wrapper goes, not a bound copy.
    own = [isinstance(obj, type) or attr in vars(obj) for obj, attr, _ in parts]
    for (obj, attr, phase), fn in zip(parts, originals, strict=True):
        setattr(obj, attr, timer.timed(phase, fn))
    if loop is not None:
        loop.launcher._compute = timer.computes(loop.launcher._compute)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for (obj, attr, _), fn, kept in zip(parts, originals, own, strict=True):
            if kept:
                setattr(obj, attr, fn)
            else:
                delattr(obj, attr)
        if loop is not None:
            del loop.launcher._compute  # the instance attribute: the class's method again


def phase_ms(engine: LLMEngine, step: Callable[[], None], num_steps: int) -> dict[str, float]:
    """Median wall ms per phase of ``num_steps`` calls of ``step`` (which steps ``engine``),
    ``host`` among them: the step less its ``wait`` for the device's ids. On CUDA each phase is
    the host's own time (a launch returns before its kernels run), so ``host`` is the chain the
    device waits on when it exceeds the device's step (`overlap.py`)."""
    timer = StepTimer()
    with instrumented(engine, timer):
        for _ in range(num_steps):
            start = time.perf_counter()
            step()
            timer.end_step(time.perf_counter() - start, keep=True)
    keys = sorted({k for s in timer.steps for k in s})
    ms = {k: 1e3 * statistics.median(s.get(k, 0.0) for s in timer.steps) for k in keys}
    ms["host"] = 1e3 * statistics.median(s["step"] - s.get("wait", 0.0) for s in timer.steps)
    return ms


def host_profile(step: Callable[[], None], num_steps: int, top: int = 25) -> list[str]:
    """cProfile of ``num_steps`` calls of ``step``: the ``top`` functions by their own time, one
    line each (calls, own ms and cumulative ms a step, where). Python's profiler multiplies the
    cost of small calls; read it for where the host's time goes, not for how much."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(num_steps):
        step()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    lines = []
    for (path, line, name), (_, calls, own_s, cum_s, _) in rows:
        where = f"{Path(path).name}:{line}({name})" if line else name
        lines.append(
            f"{calls / num_steps:8.1f} calls {1e3 * own_s / num_steps:7.3f} ms own "
            f"{1e3 * cum_s / num_steps:7.3f} ms cum  {where}"
        )
    return lines
