"""Intake: reads jobs from the consumer group, only as many as the worker has room for.

Runs on its own thread with its own tokenizer. Each job is parsed, validated and tokenized
here, then claimed atomically in Redis (``claims.py``): a job that cannot run gets its
``error`` event without ever being marked started; a job cancelled or expired while queued is
dropped; a good one is marked running, gets ``started``, and goes to the model loop's queue.
The band reader (``bands.py``) decides what is read; jobs of dead workers are taken over
first (``recovery.py``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import KW_ONLY, dataclass

import redis
import structlog

from producer.keys import is_valid_job_id
from producer.protocol import ErrorCode
from worker.service.bands import BandReader, Entry
from worker.service.claims import ClaimOutcome, Claims
from worker.service.config import WorkerConfig
from worker.service.handover import Handover
from worker.service.job_parsing import PromptLimits, Rejected, parse_job
from worker.service.metrics import WorkerMetrics
from worker.service.recovery import Resumer
from worker.service.slots import Slots


@dataclass(eq=False, repr=False)  # a thread: identity equality, Thread's repr
class Intake(threading.Thread):
    """The intake thread and the parts it calls (``build_intake`` makes them)."""

    config: WorkerConfig
    _: KW_ONLY
    reader: BandReader
    claims: Claims
    resumer: Resumer
    handover: Handover
    limits: PromptLimits
    slots: Slots
    metrics: WorkerMetrics | None = None  # counts rejections, reports queue depths

    def __post_init__(self) -> None:
        super().__init__(name="paternoster-intake", daemon=True)
        self._retry: list[Entry] = []  # claims to try again
        self.stopping = threading.Event()
        # Every line names the worker: several workers often share one log sink.
        self._log = structlog.get_logger("paternoster.intake", worker=self.config.name)

    def ensure_group(self) -> None:
        self.reader.ensure_group()

    def run(self) -> None:
        next_depths = 0.0
        while not self.stopping.is_set():
            if self.metrics is not None and time.monotonic() >= next_depths:
                next_depths = time.monotonic() + 1.0  # 3 XINFO calls a second: negligible
                self._report_depths(self.metrics)
            got = self.slots.take(self.slots.capacity, timeout_s=0.2)
            if got == 0:
                continue
            kept = 0
            try:
                kept = self._fill(got)
            except Exception as exc:  # a dead intake is a live process that never takes a job
                self._log.exception("intake_pass_failed", error=repr(exc))
                time.sleep(1.0)
            self.slots.give(got - kept)

    def _fill(self, got: int) -> int:
        """Fill up to ``got`` slots: retried claims first, then dead workers' jobs, then new
        entries. Returns how many jobs went to the model loop (each keeps its slot)."""
        if self._retry:
            retry, self._retry = self._retry[:got], self._retry[got:]
            return sum(self._take_safely(entry) for entry in retry)
        if self.resumer.due():
            kept = self._recover(got)
            if kept:  # jobs of a dead worker went to the model loop; read new ones next
                return kept
        try:
            entries = self.reader.read(got)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._log.warning("intake_read_failed", error=str(exc))
            time.sleep(1.0)
            return 0
        except redis.ResponseError as exc:
            # NOGROUP / UNBLOCKED: the jobs stream was deleted (or Redis restarted empty).
            self._log.warning("intake_group_missing", error=str(exc))
            self.reader.ensure_group()
            return 0
        return sum(self._take_safely(entry) for entry in entries)

    def _recover(self, limit: int) -> int:
        """Take over up to ``limit`` jobs of dead workers; the number now in the model loop.
        A job its dead worker never started is taken here as a new one."""
        kept, queued = self.resumer.recover(limit)
        for orphan in queued:
            kept += self._take_safely(Entry(orphan.stream, orphan.entry_id, orphan.fields))
        return kept

    def _report_depths(self, metrics: WorkerMetrics) -> None:
        try:
            depths = self.reader.depths()
        except redis.RedisError:
            return  # the read below reports the connection problem
        for band, depth in depths.items():
            metrics.queue_depth(band=band, depth=depth)

    def _take_safely(self, entry: Entry) -> bool:
        """``_take``, but no error ends the intake thread: a dead intake would leave a live
        process that never takes another job."""
        try:
            return self._take(entry)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # The entry stays pending under this worker; the claim is tried again (CLAIM is
            # idempotent for its own worker and entry) before anything new is read.
            self._log.warning("intake_claim_failed", entry_id=entry.entry_id, error=str(exc))
            self._retry.append(entry)
            time.sleep(1.0)
        except Exception as exc:
            self._log.exception("intake_failed", entry_id=entry.entry_id, error=repr(exc))
        return False

    def _take(self, entry: Entry) -> bool:
        """Claim one entry; True when it went to the model loop (and keeps its slot)."""
        job_id = entry.fields.get("id", "")
        if not is_valid_job_id(job_id):
            self._dead_letter_bad_id(entry)
            return False
        try:
            spec, ids, params = parse_job(job_id, entry.fields.get("payload"), self.limits)
        except Rejected as exc:
            self._reject(entry, job_id, exc.code, exc.message)
            return False
        except Exception as exc:  # e.g. a tokenizer failing on some input: this job, not us
            self._log.exception("job_parse_failed", job_id=job_id, tenant=None)
            message = f"could not prepare the job: {exc!r}"
            self._reject(entry, job_id, ErrorCode.INTERNAL, message)
            return False
        claim = self.claims.start(entry.stream, entry.entry_id, job_id, spec.deadline)
        if claim.outcome is not ClaimOutcome.STARTED:
            self._log.info("job_skipped", job_id=job_id, tenant=spec.tenant, state=claim.state)
            return False
        self.handover.observe_clock(claim.now)
        where = (entry.stream, entry.entry_id)
        job = self.handover.job(where, spec, ids, params, claim.submitted_at, claim.now)
        self._log.info(
            "job_started",
            job_id=job_id,
            tenant=spec.tenant,
            prompt_tokens=len(ids),
            queued_s=round(job.started_at - job.submitted_at, 6),
        )
        self.handover.hand_over(job, spec)
        return True

    def _dead_letter_bad_id(self, entry: Entry) -> None:
        self._log.error(
            "job_rejected",
            entry_id=entry.entry_id,
            job_id=entry.fields.get("id", "")[:200],
            tenant=None,  # its payload is not read: an id this bad says enough
            code="invalid_id",
        )
        self.claims.dead_letter(entry.stream, entry.entry_id, entry.fields)
        if self.metrics is not None:
            self.metrics.rejected(code="invalid_id")

    def _reject(self, entry: Entry, job_id: str, code: ErrorCode, message: str) -> None:
        claim = self.claims.reject(entry.stream, entry.entry_id, job_id, code, message)
        if self.metrics is not None:
            self.metrics.rejected(code=code.value)
        self._log.warning(
            "job_rejected",
            job_id=job_id,
            tenant=None,  # the spec did not parse (or is not passed here): tenant unknown
            code=code.value,
            message=message[:300],
            outcome=claim.state,
        )
