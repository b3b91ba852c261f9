"""The overlapped engine loop: step N+1 is scheduled and launched before step N's ids are back.

The plain `LLMEngine.step` runs schedule, forward, sampling and output processing one after
another, so on a GPU the device waits for all of the host's work between two steps. Here one
call schedules and launches step N+1 while step N still computes, then waits for N's sampled
ids, resolves them (each token takes its place in its sequence; a choice that N ended by its
token id or its length is finished), and only then does N's output processing (detokenizing,
stop strings) and returns N's outputs, so the caller's publishing also runs while N+1 computes.
The device waits for nothing the host does as long as the host's work per step is shorter than
the step (vLLM's async scheduling and SGLang's overlap scheduler do the same).

How N+1 is scheduled without N's ids: at launch each sampling sequence `reserve`s the place of
its coming token with a `PLACEHOLDER`, so the scheduler sees one more token to compute (a
decode); the runner writes that row's input from N's sampled ids on the device
(`ModelRunner.run`, `SampledFeed`), and the resolve writes the id into the sequence. The
scheduler's update of N+1 runs after the resolve, so a block it names holds real ids. A token
whose place would end its sequence by length reserves no place, so the sequence gets no row.
A choice that N ends by its id (EOS, a stop token) or a failure has one more token computed in
N+1, which is dropped; so does one ended by a stop string, found after N+1 was launched. At
most one token more, never returned.

Two kinds of rows need N's ids on the host before N+1 can be sampled or launched: a structure
constraint's or a penalty's (`PROCESSED`: the matcher and the counts follow the tokens) and
logprobs (read from N's logits, which N+1 reuses). After a step with such rows the next is
scheduled after the resolve, as before: the device waits for the resolve, the schedule and the
launch.

What the plain loop guarantees holds here too: an abort between two calls drops the token in
flight for that request (the caller has seen every token before it); a sequence preempted in
N+1's schedule gets its token of N at the resolve; seeded rows draw by (seed, output index),
which is the same in both loops; failures are contained per sequence (`step_faults`) and
reported with the step they happened in. Every step overlaps, prefill chunks included. A step's
outputs come back from the call after the one that launched it: the first call returns nothing,
and tests that count calls (a request's first token "on the next step") hold for the plain loop
only. On CUDA the sampler's per-row tensors are copied from pinned memory without blocking
(`sampling_ops.row_values`), but a step with top-p rows still waits for its forward (the nucleus
check reads one flag back).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from worker.engine.config import EngineConfig
from worker.engine.outputs import RequestOutput
from worker.engine.request_state import EmitRow, sampling_rows
from worker.engine.sampling_rows import LOGPROBS, PROCESSED, RowsBySeq
from worker.engine.scheduler_output import SchedulerOutput
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
# (state, token, logprobs, the sequence's length with the token) of rows whose text waits.
Deferred = list[EmitRow]
# Rows whose next step must wait for their ids on the host (module docstring).
NEEDS_IDS = PROCESSED | LOGPROBS


@dataclass
class Launched:
    """A step in flight, with where each sampling sequence's token goes."""

    inflight: InFlight
    places: dict[int, int]  # sequence id -> index its token takes (`RequestState.reserve`)
    ahead: bool  # the next step may be scheduled before this one's ids are back


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
        self._pending: Launched | None = None

    def step(self) -> list[RequestOutput]:
        """Launch the next step (before or after resolving the one in flight), return the
        resolved one's outputs."""
        e = self.engine
        outputs, e._aborted = e._aborted, []
        deferred: Deferred = []
        pending, self._pending = self._pending, None
        ahead = pending is not None and pending.ahead
        launched = self._launch() if ahead else None  # while `pending` computes
        if pending is not None:
            outputs += self._resolve(pending.inflight.result(), pending.places, deferred)
        if not ahead:
            launched = self._launch()
        if launched is not None:
            e.scheduler.update(launched)  # after the resolve: the blocks it names hold real ids
        failed: Failures = {}
        live = e._states
        e._emit(
            (r for r in deferred if r[0].seq.seq_id in live and not r[0].seq.is_finished),
            failed,
            outputs,
        )
        return outputs + e._fail(failed) if failed else outputs

    def _launch(self) -> SchedulerOutput | None:
        """Schedule and launch a step; the places of its tokens are reserved after the launch
        took its inputs."""
        e = self.engine
        decision = e._schedule()
        if decision.is_empty:
            return None
        states = e._states
        seq_ids = [item.seq_id for item in decision.scheduled if item.samples]
        sampling = [states[seq_id] for seq_id in seq_ids]
        rows = sampling_rows(sampling)  # taken now: the states change while it computes
        requests = RowsBySeq(seq_ids, rows)
        inflight = self.launcher.launch(decision, requests, rows.flags)
        places = dict(zip(seq_ids, [s.reserve() for s in sampling], strict=True))
        self._pending = Launched(inflight, places, not rows.flags & NEEDS_IDS)
        return decision

    def _resolve(
        self, done: StepResult, places: dict[int, int], deferred: Deferred
    ) -> list[RequestOutput]:
        """Put each live sequence's token in its place; emit now the ones that end it whatever
        its text, defer the rest's text. Failed requests end here, before the next schedule."""
        e = self.engine
        outputs: list[RequestOutput] = []
        failed = dict(done.failed)
        rows = zip(done.seq_ids, done.token_ids, done.logprobs, strict=True)
        live = e._states
        for seq_id, token, lps in rows:
            state = live.get(seq_id)
            if state is None or seq_id in failed:
                continue  # aborted, finished or failed since launch: its token is dropped
            n = places[seq_id] + 1
            if state.take(token, n - 1):
                e._emit(((state, token, lps, n),), failed, outputs)
            else:
                deferred.append((state, token, lps, n))
        return outputs + e._fail(failed)
