"""Intake: reads jobs from the consumer group, only as many as the worker has room for.

Runs on its own thread with its own tokenizer. Each job is parsed, validated and tokenized
here, then claimed atomically in Redis (``scripts.CLAIM``): a job that cannot run gets its
``error`` event without ever being marked started; a job cancelled or expired while queued is
dropped; a good one is marked running, gets ``started``, and goes to the model loop's queue.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

import redis
import structlog

from producer import scripts
from producer.fleet import queue_depths
from producer.keys import DEAD_LETTER_MAXLEN, Keys, band_of, is_valid_job_id
from producer.protocol import (
    ErrorCode,
    ErrorEvent,
    ExpiredEvent,
    JobSpec,
    event_fields,
)
from worker.engine.sampling_params import SamplingParams
from worker.service.config import WorkerConfig
from worker.service.job_parsing import PromptLimits, Rejected, parse_job
from worker.service.jobs import AdmittedJob
from worker.service.metrics import WorkerMetrics
from worker.service.recovery import Orphan, Reclaimer
from worker.service.slots import Slots

log = structlog.get_logger("paternoster.intake")


class Intake(threading.Thread):
    def __init__(
        self,
        client: redis.Redis,
        config: WorkerConfig,
        limits: PromptLimits,
        slots: Slots,
        out: queue.Queue[AdmittedJob],
        wake: threading.Event,
    ) -> None:
        super().__init__(name="paternoster-intake", daemon=True)
        self._redis = client
        self.config = config
        self.keys = Keys(config.prefix)
        self._limits = limits
        self._slots = slots
        self._out = out
        self._wake = wake
        self._claim = client.register_script(scripts.CLAIM)
        self._reserve = config.reserve(slots.capacity)
        self.metrics: WorkerMetrics | None = None  # set by the worker; counts rejections
        self._retry: list[tuple[str, str, Mapping[str, str]]] = []  # claims to try again
        self.reclaimer: Reclaimer | None = None  # set by the worker: takes over dead workers' jobs
        self.stopping = threading.Event()
        self.clock_offset_s = 0.0
        # Every line names the worker: several workers often share one log sink.
        self._log = structlog.get_logger("paternoster.intake", worker=config.name)

    def ensure_group(self) -> None:
        """Create the consumer group (and the stream) if missing, and this worker's consumer in
        it, so ``XINFO CONSUMERS`` lists the worker before its first job (a blocking
        XREADGROUP that finds nothing does not create it on Redis 7)."""
        for stream in self.keys.job_streams:
            try:
                self._redis.xgroup_create(stream, self.keys.group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._redis.xgroup_createconsumer(stream, self.keys.group, self.config.name)

    def run(self) -> None:
        next_depths = 0.0
        while not self.stopping.is_set():
            if self.metrics is not None and time.monotonic() >= next_depths:
                next_depths = time.monotonic() + 1.0  # 3 XINFO calls a second: negligible
                self._report_depths(self.metrics)
            got = self._slots.take(self._slots.capacity, timeout_s=0.2)
            if got == 0:
                continue
            kept = 0
            try:
                kept = self._fill(got)
            except Exception as exc:  # a dead intake is a live process that never takes a job
                self._log.exception("intake_pass_failed", error=repr(exc))
                time.sleep(1.0)
            self._slots.give(got - kept)

    def _fill(self, got: int) -> int:
        """Fill up to ``got`` slots: retried claims first, then dead workers' jobs, then new
        entries. Returns how many jobs went to the model loop (each keeps its slot)."""
        if self._retry:
            retry, self._retry = self._retry[:got], self._retry[got:]
            return sum(self._take_safely(*entry) for entry in retry)
        if self.reclaimer is not None and self.reclaimer.due():
            kept = self._recover(self.reclaimer, got)
            if kept:  # jobs of a dead worker went to the model loop; read new ones next
                return kept
        try:
            entries = self._read(got)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._log.warning("intake_read_failed", error=str(exc))
            time.sleep(1.0)
            return 0
        except redis.ResponseError as exc:
            # NOGROUP / UNBLOCKED: the jobs stream was deleted (or Redis restarted empty).
            self._log.warning("intake_group_missing", error=str(exc))
            self.ensure_group()
            return 0
        return sum(self._take_safely(stream, eid, fields) for stream, eid, fields in entries)

    def _recover(self, reclaimer: Reclaimer, limit: int) -> int:
        """Take over up to ``limit`` jobs of dead workers; the number now in the model loop."""
        try:
            orphans = reclaimer.take(limit)
        except redis.RedisError as exc:
            self._log.warning("reclaim_failed", error=str(exc))
            return 0
        kept = 0
        for orphan in orphans:
            if orphan.outcome == "queued":  # the dead worker never started it
                kept += self._take_safely(orphan.stream, orphan.entry_id, orphan.fields)
            elif orphan.outcome == "resumed":
                kept += self._resume_safely(reclaimer, orphan)
        return kept

    def _resume_safely(self, reclaimer: Reclaimer, orphan: Orphan) -> bool:
        job_id = orphan.fields.get("id", "")
        try:
            spec, ids, params = parse_job(job_id, orphan.fields.get("payload"), self._limits)
            times: Any = self._redis.hmget(
                self.keys.job(job_id), "submitted_at", "started_at", "first_token_at"
            )
            resume = reclaimer.published(job_id, params.n)
            seconds, micros = self._redis.time()
        except Exception as exc:  # it passed intake once: only a worker of another version
            self._log.exception("job_resume_failed", job_id=job_id, error=repr(exc))
            return False
        self.clock_offset_s = seconds + micros / 1e6 - time.time()
        submitted, started, first_token = times
        job = self._admitted(orphan.stream, orphan.entry_id, spec, ids, params, submitted, started)
        first_token_at = float(first_token) if first_token else None
        job = dataclasses.replace(job, resume=resume, first_token_at=first_token_at)
        self._log.info(
            "job_resumed",
            job_id=job_id,
            tenant=spec.tenant,
            owner=orphan.owner,
            deliveries=orphan.deliveries,
            resumed_tokens=sum(len(t) for t in resume),
        )
        self._hand_over(job, spec)
        return True

    def _hand_over(self, job: AdmittedJob, spec: JobSpec) -> None:
        if self.config.chaos and spec.metadata.get("chaos") == "crash":
            # Fault injection for the reliability tests: die like a segfault, after the claim.
            self._log.error("chaos_crash", job_id=job.job_id)
            os._exit(137)
        self._out.put(job)
        self._wake.set()

    def _report_depths(self, metrics: WorkerMetrics) -> None:
        try:
            depths = queue_depths(self._redis, self.keys)
        except redis.RedisError:
            return  # the read below reports the connection problem
        for band, depth in depths.items():
            metrics.queue_depth(band=band, depth=depth)

    def _take_safely(self, stream: str, entry_id: str, fields: Mapping[str, str]) -> bool:
        """``_take``, but no error ends the intake thread: a dead intake would leave a live
        process that never takes another job."""
        try:
            return self._take(stream, entry_id, fields)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # The entry stays pending under this worker; the claim is tried again (CLAIM is
            # idempotent for its own worker and entry) before anything new is read.
            self._log.warning("intake_claim_failed", entry_id=entry_id, error=str(exc))
            self._retry.append((stream, entry_id, fields))
            time.sleep(1.0)
        except Exception as exc:
            self._log.exception("intake_failed", entry_id=entry_id, error=repr(exc))
        return False

    def _read(self, count: int) -> list[tuple[str, str, Mapping[str, str]]]:
        """Up to ``count`` entries, most urgent band first: a band is read only when every
        more urgent one is empty. Only the interactive band may use the reserved slots."""
        free = self._slots.capacity - self._slots.in_use  # besides the ``count`` held here
        room = min(count, count + free - self._reserve)  # for the other bands
        urgent, *others = self.keys.job_streams
        streams = [urgent, *(others if room > 0 else [])]
        for stream in streams:
            entries = self._xreadgroup([stream], count if stream == urgent else room, None)
            if entries:
                return entries
        # All empty: wait on them together. XREADGROUP's COUNT is per stream, so wait on no
        # more of them than there is room for; a band left out is read on the next pass.
        waited = [urgent, *others[: max(0, min(count - 1, room))]]
        return self._xreadgroup(waited, 1, self.config.read_block_ms)

    def _xreadgroup(
        self, streams: list[str], count: int, block_ms: int | None
    ) -> list[tuple[str, str, Mapping[str, str]]]:
        reply: Any = self._redis.xreadgroup(
            self.keys.group,
            self.config.name,
            dict.fromkeys(streams, ">"),
            count=count,
            block=block_ms,
        )
        return [(stream, eid, fields) for stream, entries in reply or [] for eid, fields in entries]

    def _take(self, stream: str, entry_id: str, fields: Mapping[str, str]) -> bool:
        """Claim one entry; True when it went to the model loop (and keeps its slot)."""
        job_id = fields.get("id", "")
        if not is_valid_job_id(job_id):
            self._dead_letter_bad_id(stream, entry_id, fields)
            return False
        try:
            spec, ids, params = parse_job(job_id, fields.get("payload"), self._limits)
        except Rejected as exc:
            self._reject(stream, entry_id, job_id, exc.code, exc.message)
            return False
        except Exception as exc:  # e.g. a tokenizer failing on some input: this job, not us
            self._log.exception("job_parse_failed", job_id=job_id, tenant=None)
            self._reject(
                stream, entry_id, job_id, ErrorCode.INTERNAL, f"could not prepare the job: {exc!r}"
            )
            return False
        deadline = "" if spec.deadline is None else repr(spec.deadline)
        expired = event_fields(ExpiredEvent(message="deadline passed before the job started"))
        outcome, submitted, now = self._run_claim(
            stream, entry_id, job_id, "start", deadline, "", expired["data"]
        )
        if outcome != "started":
            self._log.info("job_skipped", job_id=job_id, tenant=spec.tenant, state=outcome)
            return False
        self.clock_offset_s = float(now) - time.time()
        job = self._admitted(stream, entry_id, spec, ids, params, submitted, now)
        self._log.info(
            "job_started",
            job_id=job_id,
            tenant=spec.tenant,
            prompt_tokens=len(ids),
            queued_s=round(job.started_at - job.submitted_at, 6),
        )
        self._hand_over(job, spec)
        return True

    def _dead_letter_bad_id(self, stream: str, entry_id: str, fields: Mapping[str, str]) -> None:
        """An entry whose id names no valid result stream has nowhere to get its error event:
        it moves, whole, to the dead-letter stream (``reason`` invalid_id), so nothing is lost
        and nobody waits on it."""
        job_id = fields.get("id", "")
        self._log.error(
            "job_rejected",
            entry_id=entry_id,
            job_id=job_id[:200],
            tenant=None,  # its payload is not read: an id this bad says enough
            code="invalid_id",
        )
        entry: dict[Any, Any] = {**fields, "entry_id": entry_id, "reason": "invalid_id"}
        entry["worker"] = self.config.name
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.xadd(self.keys.dead_letter, entry, maxlen=DEAD_LETTER_MAXLEN, approximate=True)
            pipe.xack(stream, self.keys.group, entry_id)
            pipe.xdel(stream, entry_id)
            pipe.execute()
        if self.metrics is not None:
            self.metrics.rejected(code="invalid_id")

    def _admitted(
        self,
        stream: str,
        entry_id: str,
        spec: JobSpec,
        ids: list[int],
        params: SamplingParams,
        submitted: str | None,
        started: str | None,
    ) -> AdmittedJob:
        return AdmittedJob(
            job_id=spec.id,
            entry_id=entry_id,
            stream=stream,
            prompt_token_ids=tuple(ids),
            params=params,
            tenant=spec.tenant,
            cache_salt=self._cache_salt(spec),
            submitted_at=float(submitted or 0.0),
            started_at=float(started or 0.0),
            clock_offset_s=self.clock_offset_s,
            priority=spec.priority,
            band=band_of(spec.priority),
            deadline=spec.deadline,
        )

    def _cache_salt(self, spec: JobSpec) -> str | None:
        """Isolated (the default), the tenant is always part of the salt: a job cannot name
        another tenant's salt to hit, or time, that tenant's cached prompts."""
        if not self.config.isolate_tenant_caches:
            return spec.cache_salt
        # Length-prefixed: no tenant and salt pair spells another pair's salt.
        return f"{len(spec.tenant)}:{spec.tenant}:{spec.cache_salt or ''}"

    def _reject(
        self, stream: str, entry_id: str, job_id: str, code: ErrorCode, message: str
    ) -> None:
        data = event_fields(ErrorEvent(code=code.value, message=message))["data"]
        outcome, _, _ = self._run_claim(stream, entry_id, job_id, "reject", "", data, "")
        if self.metrics is not None:
            self.metrics.rejected(code=code.value)
        self._log.warning(
            "job_rejected",
            job_id=job_id,
            tenant=None,  # the spec did not parse (or is not passed here): tenant unknown
            code=code.value,
            message=message[:300],
            outcome=outcome,
        )

    def _run_claim(
        self,
        stream: str,
        entry_id: str,
        job_id: str,
        action: str,
        deadline: str,
        error: str,
        expired: str,
    ) -> tuple[str, str, str]:
        keys = [self.keys.job(job_id), self.keys.events(job_id), stream]
        args: list[str | int] = [
            action,
            self.config.name,
            deadline,
            self.config.result_ttl_s,
            error,
            expired,
            self.keys.group,
            entry_id,
            self.keys.prefix,  # the script derives the admission-load keys from it
        ]
        outcome, submitted, now = self._claim(keys=keys, args=args)
        return str(outcome), str(submitted), str(now)
