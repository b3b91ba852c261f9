"""Keeping a failure inside a step to the request it belongs to.

A step batches many requests. When the runner, the sampler or one request's bookkeeping raises,
the failing part is redone one sequence (or one sampling row) at a time, so that only a request
that still fails on its own is failed; every other request in the step continues as if nothing
happened. Redoing a runner step is safe: nothing is committed before ``Scheduler.update``, and
the K/V a half-run step wrote is written again, for the same tokens at the same slots.

Requests are checked at admission (``engine_request.validate_request``) so none of this should
ever run; it is what keeps one request's surprise from ending the worker process.
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


def describe(exc: BaseException) -> str:
    """The message a failed request's error event carries: the exception, at most 300 chars."""
    return f"{type(exc).__name__}: {exc}"[:300]


def run_contained(runner: ModelRunner, decision: SchedulerOutput) -> tuple[RunnerOutput, Failures]:
    """The runner's output for ``decision``, and the sequences that failed on their own."""
    try:
        return runner.run(decision), {}
    except Exception as exc:
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
        log.exception("sampling_failed", num_rows=len(requests), error=describe(exc))
    ids: list[int] = []
    logprobs: list[TokenLogprobs | None] = []
    failed: dict[int, str] = {}
    for row, request in enumerate(requests):
        try:
            one = sampler(logits[row : row + 1], [request])
        except Exception as exc:  # seeded rows draw the same alone as in a batch
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
