"""Intake: reads jobs from the consumer group, only as many as the worker has room for.

Runs on its own thread with its own tokenizer. Each job is parsed, validated and tokenized
here, then claimed atomically in Redis (``scripts.CLAIM``): a job that cannot run gets its
``error`` event without ever being marked started; a job cancelled or expired while queued is
dropped; a good one is marked running, gets ``started``, and goes to the model loop's queue.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

import redis
import structlog
from pydantic import ValidationError

from producer import scripts
from producer.keys import Keys, is_valid_job_id
from producer.protocol import (
    SUPPORTED_SCHEMA_VERSIONS,
    ErrorCode,
    ErrorEvent,
    ExpiredEvent,
    JobSpec,
    event_fields,
)
from worker.engine.prompt import (
    InvalidRequestError,
    PromptTooLongError,
    check_prompt,
    encode_prompt,
)
from worker.engine.sampling_params import InvalidSamplingParams, SamplingParams
from worker.service.config import WorkerConfig
from worker.service.jobs import AdmittedJob
from worker.service.slots import Slots

log = structlog.get_logger("paternoster.intake")


class Rejected(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class PromptLimits:
    """What intake needs of the engine to validate prompts, without touching the engine."""

    def __init__(self, tokenizer: Any, max_model_len: int, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size


def parse_job(job_id: str, payload: str | None, limits: PromptLimits) -> tuple[JobSpec, list[int]]:
    """The validated spec and prompt token ids, or Rejected with the error code to publish."""
    try:
        raw = json.loads(payload or "")
    except json.JSONDecodeError as exc:
        raise Rejected(ErrorCode.MALFORMED_JSON, f"payload is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise Rejected(ErrorCode.MALFORMED_JSON, "payload must be a JSON object")
    version = raw.get("schema_version", 1)
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        raise Rejected(
            ErrorCode.UNSUPPORTED_SCHEMA_VERSION,
            f"schema_version {version!r} is not supported by this worker "
            f"(supported: {sorted(SUPPORTED_SCHEMA_VERSIONS)})",
        )
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as exc:
        raise Rejected(ErrorCode.INVALID_REQUEST, _short(exc)) from exc
    if spec.id != job_id:
        raise Rejected(ErrorCode.INVALID_REQUEST, f"payload id {spec.id!r} != entry id {job_id!r}")
    return spec, _prompt_ids(spec, limits)


def _prompt_ids(spec: JobSpec, limits: PromptLimits) -> list[int]:
    try:
        if spec.prompt_token_ids is not None:
            ids = list(spec.prompt_token_ids)
        elif spec.messages is not None:
            ids = encode_prompt(limits.tokenizer, [m.model_dump() for m in spec.messages])
        else:
            ids = encode_prompt(limits.tokenizer, spec.prompt or "")
        check_prompt(ids, limits.max_model_len, limits.vocab_size)
    except PromptTooLongError as exc:
        raise Rejected(ErrorCode.PROMPT_TOO_LONG, str(exc)) from exc
    except InvalidRequestError as exc:
        raise Rejected(ErrorCode.INVALID_PROMPT, str(exc)) from exc
    return ids


def _short(exc: ValidationError) -> str:
    parts = [f"{'.'.join(map(str, e['loc'])) or 'job'}: {e['msg']}" for e in exc.errors()[:5]]
    return "invalid job: " + "; ".join(parts)


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
        self.stopping = threading.Event()
        self.clock_offset_s = 0.0

    def ensure_group(self) -> None:
        """Create the consumer group (and the stream) if missing, and this worker's consumer in
        it, so ``XINFO CONSUMERS`` lists the worker before its first job (a blocking
        XREADGROUP that finds nothing does not create it on Redis 7)."""
        try:
            self._redis.xgroup_create(self.keys.jobs, self.keys.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._redis.xgroup_createconsumer(self.keys.jobs, self.keys.group, self.config.name)

    def run(self) -> None:
        while not self.stopping.is_set():
            got = self._slots.take(self._slots.capacity, timeout_s=0.2)
            if got == 0:
                continue
            try:
                entries = self._read(got)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._slots.give(got)
                log.warning("intake_read_failed", error=str(exc))
                time.sleep(1.0)
                continue
            except redis.ResponseError as exc:
                # NOGROUP / UNBLOCKED: the jobs stream was deleted (or Redis restarted empty).
                self._slots.give(got)
                log.warning("intake_group_missing", error=str(exc))
                self.ensure_group()
                continue
            self._slots.give(got - len(entries))
            for entry_id, fields in entries:
                if not self._take_safely(entry_id, fields):
                    self._slots.give(1)

    def _take_safely(self, entry_id: str, fields: Mapping[str, str]) -> bool:
        """``_take``, but no error ends the intake thread: a dead intake would leave a live
        process that never takes another job."""
        try:
            return self._take(entry_id, fields)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # The entry stays pending in the group: it is not lost, only not started here.
            log.warning("intake_claim_failed", entry_id=entry_id, error=str(exc))
            time.sleep(1.0)
        except Exception as exc:
            log.exception("intake_failed", entry_id=entry_id, error=repr(exc))
        return False

    def _read(self, count: int) -> list[tuple[str, Mapping[str, str]]]:
        reply: Any = self._redis.xreadgroup(
            self.keys.group,
            self.config.name,
            {self.keys.jobs: ">"},
            count=count,
            block=self.config.read_block_ms,
        )
        return list(reply[0][1]) if reply else []

    def _take(self, entry_id: str, fields: Mapping[str, str]) -> bool:
        """Claim one entry; True when it went to the model loop (and keeps its slot)."""
        job_id = fields.get("id", "")
        if not is_valid_job_id(job_id):
            # Nowhere to report it: no valid result stream name. Log and acknowledge.
            log.error("job_rejected", entry_id=entry_id, job_id=job_id[:200], code="invalid_id")
            self._redis.xack(self.keys.jobs, self.keys.group, entry_id)
            self._redis.xdel(self.keys.jobs, entry_id)
            return False
        try:
            spec, ids = parse_job(job_id, fields.get("payload"), self._limits)
            params = SamplingParams(**spec.sampling.model_dump())
        except Rejected as exc:
            self._reject(entry_id, job_id, exc.code, exc.message)
            return False
        except InvalidSamplingParams as exc:
            self._reject(entry_id, job_id, ErrorCode.INVALID_REQUEST, str(exc))
            return False
        except Exception as exc:  # e.g. a tokenizer failing on some input: this job, not us
            log.exception("job_parse_failed", job_id=job_id)
            self._reject(
                entry_id, job_id, ErrorCode.INTERNAL, f"could not prepare the job: {exc!r}"
            )
            return False
        deadline = "" if spec.deadline is None else repr(spec.deadline)
        expired = event_fields(ExpiredEvent(message="deadline passed before the job started"))
        outcome, submitted, now = self._run_claim(
            entry_id, job_id, "start", deadline, "", expired["data"]
        )
        if outcome != "started":
            log.info("job_skipped", job_id=job_id, state=outcome)
            return False
        self.clock_offset_s = float(now) - time.time()
        job = AdmittedJob(
            job_id=job_id,
            entry_id=entry_id,
            prompt_token_ids=tuple(ids),
            params=params,
            tenant=spec.tenant,
            cache_salt=spec.cache_salt or self._tenant_salt(spec.tenant),
            submitted_at=float(submitted),
            started_at=float(now),
            clock_offset_s=self.clock_offset_s,
        )
        log.info(
            "job_started",
            job_id=job_id,
            prompt_tokens=len(ids),
            queued_s=round(job.started_at - job.submitted_at, 6),
        )
        self._out.put(job)
        self._wake.set()
        return True

    def _tenant_salt(self, tenant: str) -> str | None:
        return f"tenant:{tenant}" if self.config.isolate_tenant_caches else None

    def _reject(self, entry_id: str, job_id: str, code: ErrorCode, message: str) -> None:
        data = event_fields(ErrorEvent(code=code.value, message=message))["data"]
        outcome, _, _ = self._run_claim(entry_id, job_id, "reject", "", data, "")
        log.warning(
            "job_rejected", job_id=job_id, code=code.value, message=message[:300], outcome=outcome
        )

    def _run_claim(
        self, entry_id: str, job_id: str, action: str, deadline: str, error: str, expired: str
    ) -> tuple[str, str, str]:
        keys = [self.keys.job(job_id), self.keys.events(job_id), self.keys.jobs]
        args: list[str | int] = [
            action,
            self.config.name,
            deadline,
            self.config.result_ttl_s,
            error,
            expired,
            self.keys.group,
            entry_id,
        ]
        outcome, submitted, now = self._claim(keys=keys, args=args)
        return str(outcome), str(submitted), str(now)
