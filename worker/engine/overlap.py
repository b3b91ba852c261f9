"""The overlapped engine loop: step N's text is made while step N+1 computes.

The plain `LLMEngine.step` runs schedule, forward, sampling and output processing one after
another. Here one call resolves step N (waits for its sampled ids, appends them), schedules and
launches step N+1 (`step_launch`), and only then does N's output processing (detokenizing and
stop strings) and returns N's outputs, so that the caller's publishing also runs while N+1
computes. What the schedule of N+1 must know is known before it: every token of N has joined
its sequence, and a choice that N ended by its token id or its length (`RequestState.take`)
is finished first, so it computes nothing more. Only a stop string is found
after N+1 was launched: that choice computes one token more, which is dropped, never returned.

What the plain loop guarantees holds here too: an abort between two calls drops the token in
flight for that request (the caller has seen every token before it); a sequence preempted in
N+1's schedule already holds its token of N; seeded rows draw by (seed, output index), which is
the same in both loops; failures are contained per sequence (`step_faults`) and reported with
the step they happened in. Every step overlaps, prefill chunks included. A step's outputs come
back from the call after the one that launched it: the first call returns nothing, and tests
that count calls (a request's first token "on the next step") hold for the plain loop only.

Not yet: step N+1 is scheduled after N's ids reached the host, so the device idles while the
host resolves N and schedules and prepares N+1 (vLLM's async scheduling and SGLang's overlap
scheduler schedule N+1 before, reading N's ids on the device). On CUDA the sampler's per-row
tensors (temperatures, min-p, top-k, top-p, row and min-tokens indices) are copied from pinned
memory without blocking (`sampling_ops.row_values`; not measured: no GPU at hand), but a step
with top-p rows still waits for its forward (the nucleus check reads one flag back), and so do
penalties and constraints (their values are copied from pageable memory).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch

from worker.engine.config import EngineConfig
from worker.engine.outputs import RequestOutput
from worker.engine.request_state import RequestState, sampling_rows
from worker.engine.sampler import TokenLogprobs
from worker.engine.step_faults import Failures
from worker.engine.step_launch import InFlight, StepLauncher, StepResult

if TYPE_CHECKING:
    from worker.engine.llm_engine import LLMEngine

Mode = Literal["off", "async", "thread"]
# The default by device type. CUDA launches are asynchronous: the host's work on N overlaps the
# device's on N+1 for free (not measured: no GPU at hand). CPU: the plain loop, unchanged.
# `ops/bench/overlap_loop.py --batches 64 --modes M --rounds 2`, one process per mode, on our
# shared 2-core machine (load ~5): off 57-71 ms a step (CPU 37-40 ms), async 73 (48), thread
# 11.4 (11.4): thread's CPU time fell with its wall time, which hiding output processing cannot
# do; its ops ran on one core. With --threads 1: off 16.6 ms (12.3), thread 18.4 (13.2). So the
# overlap itself does not pay on 2 cores; one intra-op thread does (not this module's to set).
DEFAULT_MODES: dict[str, Mode] = {"cuda": "async", "cpu": "off"}
Deferred = list[tuple[RequestState, int, TokenLogprobs | None]]


def overlap_mode(config: EngineConfig, device: torch.device) -> Mode:
    """The loop ``config.overlap_steps`` asks for on ``device`` (auto: `DEFAULT_MODES`)."""
    if config.overlap_steps != "auto":
        return config.overlap_steps
    return DEFAULT_MODES.get(device.type, "off")


class OverlapLoop:
    """`LLMEngine.step` with one step in flight between calls."""

    def __init__(self, engine: LLMEngine, mode: Mode) -> None:
        self.engine = engine
        self.launcher = StepLauncher(engine.runner, engine.sampler, mode)
        self._pending: InFlight | None = None

    def step(self) -> list[RequestOutput]:
        """Resolve the step in flight, launch the next, return the resolved one's outputs."""
        e = self.engine
        outputs, e._aborted = e._aborted, []
        deferred: Deferred = []
        if self._pending is not None:
            done, self._pending = self._pending.result(), None
            outputs += self._resolve(done, deferred)
        decision = e._schedule()
        if not decision.is_empty:
            states = e._states
            sampling = [states[item.seq_id] for item in decision.scheduled if item.samples]
            rows = sampling_rows(sampling)  # taken now: the states change while it computes
            requests = dict(zip([s.seq.seq_id for s in sampling], rows, strict=True))
            self._pending = self.launcher.launch(decision, requests, rows.flags)
            e.scheduler.update(decision)
        failed: Failures = {}
        append, live = e._append, e._states
        for state, token, lps in deferred:
            if state.seq.seq_id in live and not state.seq.is_finished:
                out = append(state, token, lps, failed, appended=True)
                if out is not None:
                    outputs.append(out)
        return outputs + e._fail(failed) if failed else outputs

    def _resolve(self, done: StepResult, deferred: Deferred) -> list[RequestOutput]:
        """Append each live sequence's token; emit now the ones that end it whatever its text,
        defer the rest's text. Failed requests end here, before the next schedule."""
        e = self.engine
        outputs: list[RequestOutput] = []
        failed = dict(done.failed)
        rows = zip(done.seq_ids, done.token_ids, done.logprobs, strict=True)
        live = e._states
        for seq_id, token, lps in rows:
            state = live.get(seq_id)
            if state is None or seq_id in failed:
                continue  # aborted, finished or failed since launch: its token is dropped
            if state.take(token):
                out = e._append(state, token, lps, failed, appended=True)
                if out is not None:
                    outputs.append(out)
            else:
                deferred.append((state, token, lps))
        return outputs + e._fail(failed)
