"""Starting a step's forward pass and sampling without waiting for them, and waiting later.

`overlap.OverlapLoop` launches step N+1 and then streams step N's text while N+1 computes. A
launch returns an `InFlight` at once; ``result()`` blocks until the step's sampled ids are on
the host. Two ways to launch:

- ``async``: on the calling thread. On CUDA the kernels are queued and the host goes on; the
  step ends with one device-to-host copy of the sampled ids (non-blocking, into pinned memory)
  and an event. On the CPU every op runs as it is called, so this only reorders the loop (the
  tests drive the overlapped loop's logic that way).
- ``thread``: forward and sampling on one background thread; torch releases the GIL inside
  ops, so the caller's Python (detokenizing, publishing) may run meanwhile on another core.

Failures stay contained as in the plain loop (`step_faults`): a runner or sampler failure is
retried per sequence or per row, and the sequences that still fail come back in ``failed``; a
device fault raises `DeviceFault`, also where CUDA reports it late, at ``result()``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from worker.engine.model_runner import ModelRunner, RunnerOutput, SampledFeed
from worker.engine.sampler import Sampler, SamplingRequest, TokenLogprobs
from worker.engine.sampling_rows import ALL, LOGPROBS, SamplingRows, UnreadRows, flags_of
from worker.engine.scheduler_output import SchedulerOutput
from worker.engine.step_faults import (
    DeviceFault,
    Failures,
    raise_if_device_fault,
    run_contained,
    sample_contained,
)


@dataclass
class StepResult:
    """A finished step on the host: per sampling row its sequence, token and logprobs."""

    seq_ids: tuple[int, ...]
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]
    failed: Failures = field(default_factory=dict)  # sequence id -> what went wrong


class InFlight:
    """A launched step; `result` waits for its sampled ids (once)."""

    def __init__(
        self,
        seq_ids: tuple[int, ...],
        ids: torch.Tensor | Future[StepResult] | StepResult,
        logits: torch.Tensor | None = None,
        requests: Sequence[SamplingRequest] | None = None,
        failed: Failures | None = None,
    ) -> None:
        self._seq_ids = seq_ids
        self._ids = ids
        self._logits = logits  # kept alive until the logprobs are read from them
        self._requests = requests or []
        self._failed = failed or {}
        self._ready: torch.cuda.Event | None = None
        if isinstance(ids, torch.Tensor) and ids.device.type == "cuda":
            self._ids = ids.to("cpu", non_blocking=True)  # pinned: the step's one copy back
            self._ready = torch.cuda.Event()
            self._ready.record()

    def result(self) -> StepResult:
        ids = self._ids
        if isinstance(ids, StepResult):
            return ids
        if isinstance(ids, Future):
            return ids.result()
        try:  # on CUDA an asynchronous kernel's error surfaces here, at the wait
            return self._read(ids)
        except Exception as exc:
            raise_if_device_fault(exc)
            raise

    def _read(self, ids: torch.Tensor) -> StepResult:
        if self._ready is not None:
            self._ready.synchronize()
        token_ids = ids.tolist()
        logprobs: list[TokenLogprobs | None] = [None] * len(token_ids)
        if self._logits is not None and flags_of(self._requests) & LOGPROBS:
            # Read here, before the next step is launched: a read after it would wait for it.
            logprobs = Sampler.logprobs(self._logits, token_ids, self._requests)
        return StepResult(self._seq_ids, token_ids, logprobs, self._failed)


# The step thread needs the GIL between its ops, and the caller's Python (the last step's text)
# keeps it for up to the interpreter's switch interval (5 ms by default) before handing it over.
# `ops/bench/host_overhead.py --overlap-steps thread --batches 256` (load average ~6): the step
# thread sat idle 6.2 ms between two steps with 5 ms, 2.2 ms with 1 ms, 1.5 ms with 0.2 ms.
THREAD_SWITCH_INTERVAL_S = 0.0002


class StepLauncher:
    """Launches steps of ``runner`` and ``sampler``, ``async`` or on a ``thread``."""

    def __init__(self, runner: ModelRunner, sampler: Sampler, mode: str) -> None:
        if mode not in ("async", "thread"):
            raise ValueError(f"no launch mode {mode!r}")
        self.runner = runner
        self.sampler = sampler
        self._pool = None
        self._fault: DeviceFault | None = None  # the step thread's, once it had one
        if mode == "thread":
            self._pool = ThreadPoolExecutor(1, "paternoster-step")
            # Process-wide, and only ever lowered: the thread mode is the one that needs it.
            sys.setswitchinterval(min(sys.getswitchinterval(), THREAD_SWITCH_INTERVAL_S))

    def launch(
        self, decision: SchedulerOutput, requests: Mapping[int, SamplingRequest], flags: int = ALL
    ) -> InFlight:
        """Start ``decision``; ``requests``: the sampling request of each sequence that samples
        in it, taken before the launch (the caller changes its states meanwhile); ``flags``:
        their `sampling_rows` flags joined."""
        if self._pool is not None:
            return InFlight((), self._pool.submit(self._compute, decision, requests, flags))
        result, failed = run_contained(self.runner, decision)
        rows = _rows(requests, result.seq_ids, flags)
        if rows:
            try:
                ids = self.sampler.sample_ids(result.logits, rows)
                self.runner.feed = SampledFeed(result.seq_ids, ids)
                # Held only for logprobs: a held CPU `LogitsBuffer` makes the next step, launched
                # before this one's ids are read, write a fresh one (50 MB at 256 rows of 49k:
                # 12.9-13.9 ms CPU a step more at B=256 in host_overhead.py --overlap-steps async).
                logits = result.logits if flags & LOGPROBS else None
                return InFlight(result.seq_ids, ids, logits, rows, failed)
            except Exception as exc:  # sampled again below, row by row where needed, as
                raise_if_device_fault(exc)  # the plain loop does; not after a device fault
        return InFlight(result.seq_ids, self._sample(result, failed, rows))

    def _compute(
        self, decision: SchedulerOutput, requests: Mapping[int, SamplingRequest], flags: int
    ) -> StepResult:
        """The whole step, as the plain loop runs it (on the background thread). A step
        launched ahead of a device fault's report never touches the device."""
        if self._fault is not None:
            raise self._fault
        try:
            result, failed = run_contained(self.runner, decision)
            return self._sample(result, failed, _rows(requests, result.seq_ids, flags))
        except DeviceFault as fault:
            self._fault = fault
            raise

    def _sample(
        self, result: RunnerOutput, failed: Failures, rows: Sequence[SamplingRequest]
    ) -> StepResult:
        """Sampled on the host now, failures contained (`sample_contained`)."""
        if not rows:
            self.runner.feed = None  # no token in flight: no row reads one
            return StepResult(result.seq_ids, [], [], failed)
        sampled, bad_rows = sample_contained(self.sampler, result.logits, rows)
        failed |= {result.seq_ids[row]: why for row, why in bad_rows.items()}
        fed = torch.tensor([max(t, 0) for t in sampled.token_ids], device=self.runner.device)
        self.runner.feed = SampledFeed(result.seq_ids, fed)
        return StepResult(result.seq_ids, sampled.token_ids, sampled.logprobs, failed)


def _rows(
    requests: Mapping[int, SamplingRequest], seq_ids: tuple[int, ...], flags: int
) -> SamplingRows | UnreadRows:
    """The requests of the rows ``seq_ids`` in order, with ``flags``: the runner keeps every
    sampling row of the decision (a failed sequence only drops rows, never adds one)."""
    if not flags:  # no pass reads a row: built only if one is read
        return UnreadRows(len(seq_ids), lambda: [requests[sid] for sid in seq_ids])
    rows = SamplingRows([requests[sid] for sid in seq_ids])
    rows.flags = flags
    return rows
