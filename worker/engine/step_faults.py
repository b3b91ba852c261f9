"""Keeping a failure inside a step to the request it belongs to.

A step batches many requests. When the runner, the sampler or one request's bookkeeping raises,
the failing part is redone one sequence (or one sampling row) at a time, so that only a request
that still fails on its own is failed; every other request in the step continues as if nothing
happened. Redoing a runner step is safe: nothing is committed before ``Scheduler.update``, and
the K/V a half-run step wrote is written again, for the same tokens at the same slots.

Requests are checked at admission (``engine_request.validate_request``) so none of this should
ever run; it is what keeps one request's surprise from ending the worker process.

A device fault is the exception: a CUDA error such as an illegal memory access or a
device-side assert is sticky, every later kernel launch and copy in the process fails with it,
so redoing the step row by row would fail every request in it for the device's fault. Such an
error is raised as `DeviceFault`, at once and for the whole step; the job worker hands its jobs
back to other workers and exits non-zero, so its supervisor starts a fresh process.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog
import torch

from worker.engine.model_runner import ModelRunner, RunnerOutput
from worker.engine.sampler import Sampler, SamplerOutput, SamplingRequest, TokenLogprobs
from worker.engine.scheduler_output import SchedulerOutput

log = structlog.get_logger("paternoster.engine")
Failures = dict[int, str]  # sequence id -> what went wrong, for the request's error event
# What torch's CUDA errors say: "CUDA error: an illegal memory access was encountered",
# "device-side assert triggered", cuBLAS's "CUBLAS_STATUS_EXECUTION_FAILED", the driver's
# "CUDA_ERROR_LAUNCH_FAILED". Before torch 2.8 they came as plain RuntimeErrors.
DEVICE_FAULT_MARKS = ("CUDA error", "device-side assert", "CUBLAS_STATUS_", "CUDA_ERROR_")
# Not sticky: the context survives a failed allocation, and a row-by-row retry needs less memory.
NOT_STICKY_MARKS = ("out of memory",)


class DeviceFault(RuntimeError):
    """The device failed in a way no retry in this process can mend (its context is poisoned):
    the step's requests are not at fault and must run again elsewhere."""


def is_device_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is a sticky accelerator error rather than one request's failure."""
    if isinstance(exc, DeviceFault):
        return True
    if isinstance(exc, torch.OutOfMemoryError) or not isinstance(exc, RuntimeError):
        return False
    text = str(exc)
    if any(mark in text for mark in NOT_STICKY_MARKS):
        return False
    accelerator = getattr(torch, "AcceleratorError", ())  # torch >= 2.8: every CUDA error
    return isinstance(exc, accelerator) or any(mark in text for mark in DEVICE_FAULT_MARKS)


def raise_if_device_fault(exc: BaseException) -> None:
    """Raise `DeviceFault` from ``exc`` if it is one (logged once, as the step's end)."""
    if isinstance(exc, DeviceFault):
        raise exc
    if is_device_fault(exc):
        log.error("device_fault", error=describe(exc))
        raise DeviceFault(describe(exc)) from exc


def describe(exc: BaseException) -> str:
    """The message a failed request's error event carries: the exception, at most 300 chars."""
    return f"{type(exc).__name__}: {exc}"[:300]


def run_contained(runner: ModelRunner, decision: SchedulerOutput) -> tuple[RunnerOutput, Failures]:
    """The runner's output for ``decision``, and the sequences that failed on their own."""
    try:
        return runner.run(decision), {}
    except Exception as exc:
        raise_if_device_fault(exc)
        log.exception("step_failed", num_sequences=len(decision.scheduled), error=describe(exc))
        if len(decision.scheduled) == 1:
            return _no_rows(runner), {decision.scheduled[0].seq_id: describe(exc)}
    parts: list[RunnerOutput] = []
    failed: Failures = {}
    for item in decision.scheduled:
        alone = SchedulerOutput((item,), item.num_scheduled_tokens, preempted_ids=())
        try:
            parts.append(runner.run(alone))
        except Exception as exc:
            raise_if_device_fault(exc)
            failed[item.seq_id] = describe(exc)
    log.warning("step_isolated", num_sequences=len(decision.scheduled), num_failed=len(failed))
    if not parts:
        return _no_rows(runner), failed
    merged = RunnerOutput(
        request_ids=tuple(r for p in parts for r in p.request_ids),
        logits=torch.cat([p.logits for p in parts]),
        seq_ids=tuple(s for p in parts for s in p.seq_ids),
    )
    return merged, failed


def sample_contained(
    sampler: Sampler, logits: torch.Tensor, requests: Sequence[SamplingRequest]
) -> tuple[SamplerOutput, dict[int, str]]:
    """One token per row, and the rows (by index) that could not be sampled. A failed row's
    token id is -1; it must not be appended."""
    try:
        return sampler(logits, requests), {}
    except Exception as exc:
        raise_if_device_fault(exc)
        log.exception("sampling_failed", num_rows=len(requests), error=describe(exc))
    ids: list[int] = []
    logprobs: list[TokenLogprobs | None] = []
    failed: dict[int, str] = {}
    for row, request in enumerate(requests):
        try:
            one = sampler(logits[row : row + 1], [request])
        except Exception as exc:  # seeded rows draw the same alone as in a batch
            raise_if_device_fault(exc)
            failed[row] = describe(exc)
            ids.append(-1)
            logprobs.append(None)
            continue
        ids += one.token_ids
        logprobs += one.logprobs
    return SamplerOutput(token_ids=ids, logprobs=logprobs), failed


def _no_rows(runner: ModelRunner) -> RunnerOutput:
    vocab = runner.model.config.vocab_size
    return RunnerOutput((), torch.empty((0, vocab), device=runner.device), ())
