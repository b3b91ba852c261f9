"""Where a job's time to first token goes inside the worker: one ``job_first_token`` log line.

A job's TTFT (submit to first token, ``timings.ttft_s``) crosses four stretches, each logged in
seconds on the line the worker writes when the job's first token event is built:

- ``queued_s``: submit to the claim (the entry waiting in Redis, then intake reading it);
- ``inbox_s``: the claim to the model loop taking the job from the inbox and adding it to the
  engine (the loop finishes the step it is in first: ``after_step_s`` long, of
  ``after_step_tokens`` tokens, is the last step before the job went in);
- ``to_step_s``: from there to the start of the step that gave the first token (``steps``:
  how many steps ran in between; more than 0 when a step left it waiting or it was chunked);
- ``step_s``: that step, from its start to its outputs.

``ops/bench/batch_api.py --trace`` joins these lines with its probes. A job taken over from a
dead worker had its first token there: it is not traced again.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from worker.service.jobs import ActiveJob
from worker.service.metrics import WorkerMetrics


class _Admitted(NamedTuple):
    at: float  # this host's time.time()
    step: int  # steps the loop had run before
    after_step_s: float  # the last of them: how long it took, and its tokens
    after_step_tokens: int


class FirstTokenTrace:
    """Per job in the engine without a first token: when and at which step it was admitted;
    at its first token, the log line and the TTFT histogram."""

    def __init__(self, log: Any, metrics: WorkerMetrics | None = None) -> None:
        self._log = log
        self._metrics = metrics
        self._admitted: dict[str, _Admitted] = {}
        self._last_step = (0.0, 0)  # the loop's last step: seconds, batched tokens

    def __len__(self) -> int:
        return len(self._admitted)

    def stepped(self, step_s: float, num_batched_tokens: int) -> None:
        """The loop ran a step of ``step_s`` seconds (forward to outputs handled)."""
        self._last_step = (step_s, num_batched_tokens)

    def admitted(self, job: ActiveJob, step: int, now: float | None = None) -> None:
        """``job`` went into the engine after ``step`` steps."""
        if job.first_token_at is None:
            at = time.time() if now is None else now
            self._admitted[job.job.job_id] = _Admitted(at, step, *self._last_step)

    def first_token(self, job: ActiveJob, step: int, step_started_at: float) -> None:
        """``job``'s first token came out of step number ``step`` (counted from 0), which
        started at ``step_started_at`` (``time.time()``); logs the split once."""
        admitted = self._admitted.pop(job.job.job_id, None)
        if job.first_token_at is None:
            return
        ttft_s = job.first_token_at - job.job.submitted_at
        if self._metrics is not None:
            self._metrics.first_token(band=job.job.band, ttft_s=ttft_s)
        if admitted is None:
            return
        offset = job.job.clock_offset_s  # the job's times are on the Redis clock
        self._log.info(
            "job_first_token",
            job_id=job.job.job_id,
            tenant=job.job.request.tenant,
            band=job.job.band,
            queued_s=round(job.job.started_at - job.job.submitted_at, 6),
            inbox_s=round(admitted.at + offset - job.job.started_at, 6),
            to_step_s=round(step_started_at - admitted.at, 6),
            step_s=round(job.first_token_at - offset - step_started_at, 6),
            steps=step - admitted.step,
            after_step_s=round(admitted.after_step_s, 6),
            after_step_tokens=admitted.after_step_tokens,
            ttft_s=round(ttft_s, 6),
        )

    def forget(self, job_id: str) -> None:
        """``job_id`` ended (before its first token, or after)."""
        self._admitted.pop(job_id, None)
