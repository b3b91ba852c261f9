"""A claimed job, made ready for the engine and handed to the model loop.

Both ways a job reaches this worker end here: intake's claim of a new entry and the takeover
of a dead worker's job (``recovery.Resumer``). What they share is built once: the job's times
on the Redis clock, its prefix-cache salt, and the chaos hook of the reliability tests.
"""

from __future__ import annotations

import os
import time

import structlog

from producer.keys import band_of
from producer.protocol import JobSpec
from producer.webhook_lua import Hook
from worker.engine.engine_request import EngineRequest
from worker.engine.sampling_params import SamplingParams
from worker.service.config import WorkerConfig
from worker.service.inbox import Inbox
from worker.service.jobs import AdmittedJob


class Handover:
    def __init__(self, config: WorkerConfig, inbox: Inbox) -> None:
        self.config = config
        self._inbox = inbox
        # Redis clock minus this host's, measured at the last claim: a job's times are the
        # Redis server's, so two workers on skewed hosts report the same queue wait.
        self.clock_offset_s = 0.0
        self._log = structlog.get_logger("paternoster.intake", worker=config.name)

    def observe_clock(self, redis_now_s: float) -> None:
        self.clock_offset_s = redis_now_s - time.time()

    def job(
        self,
        entry: tuple[str, str],
        spec: JobSpec,
        prompt_token_ids: list[int],
        params: SamplingParams,
        submitted_at: float,
        started_at: float,
        resume: tuple[tuple[int, ...], ...] = (),
        first_token_at: float | None = None,
    ) -> AdmittedJob:
        """The job of ``entry`` (its jobs stream and entry id), started at ``started_at``;
        a dead worker's job continues after the tokens each choice streamed (``resume``)."""
        stream, entry_id = entry
        request = EngineRequest(
            spec.id,
            tuple(prompt_token_ids),
            params,
            priority=spec.priority,
            tenant=spec.tenant,
            cache_salt=self.cache_salt(spec),
            resume=resume,
            # Its submission moved onto the engine's clock: the engine ages it from then.
            arrival_time=self.arrival_time(submitted_at),
        )
        return AdmittedJob(
            request,
            entry_id=entry_id,
            stream=stream,
            submitted_at=submitted_at,
            started_at=started_at,
            clock_offset_s=self.clock_offset_s,
            band=band_of(spec.priority),
            deadline=spec.deadline,
            first_token_at=first_token_at,
            terminal_webhook=spec.webhook is not None and spec.webhook.wants(Hook.TERMINAL),
        )

    def arrival_time(self, submitted_at: float) -> float:
        """``submitted_at`` (Redis clock, unix s) on the engine's clock (``time.monotonic``):
        now less the wait since, which counts from the Redis clock, never negative."""
        waited_s = max(0.0, time.time() + self.clock_offset_s - submitted_at)
        return time.monotonic() - waited_s

    def cache_salt(self, spec: JobSpec) -> str | None:
        """Isolated (the default), the tenant is always part of the salt: a job cannot name
        another tenant's salt to hit, or time, that tenant's cached prompts."""
        if not self.config.isolate_tenant_caches:
            return spec.cache_salt
        # Length-prefixed: no tenant and salt pair spells another pair's salt.
        return f"{len(spec.tenant)}:{spec.tenant}:{spec.cache_salt or ''}"

    def hand_over(self, job: AdmittedJob, spec: JobSpec) -> None:
        if self.config.chaos and spec.metadata.get("chaos") == "crash":
            # Fault injection for the reliability tests: die like a segfault, after the claim.
            self._log.error("chaos_crash", job_id=job.job_id)
            os._exit(137)
        self._inbox.admit(job)
