"""Deadlines of the jobs a worker runs: checked by the model loop before each step.

A running job past its deadline ends with what it produced (finish_reason ``deadline``); one
that produced nothing yet ends ``expired`` (``ActiveJob._terminal``). The engine frees its
blocks at once and reports the abort at its next step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from producer.status import FinishReason
from worker.engine.llm_engine import LLMEngine
from worker.service.jobs import ActiveJob


def end_past_deadline(active: Mapping[str, ActiveJob], engine: LLMEngine, log: Any) -> bool:
    """Abort every job of ``active`` past its deadline; whether the engine now has an abort to
    report (the loop must step even with nothing else to run)."""
    aborted = False
    for job_id, job in active.items():
        deadline = job.job.deadline
        if deadline is not None and job.ending is None and job.now() > deadline:
            job.ending = FinishReason.DEADLINE
            aborted |= engine.abort(job_id)
            log.info(
                "job_deadline",
                job_id=job_id,
                tenant=job.job.request.tenant,
                completion_tokens=job.num_published_tokens,
            )
    return aborted
