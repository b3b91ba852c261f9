"""The job worker: Redis Streams in, one continuous batch stepped, every token published.

Three helper threads do the I/O (intake, cancels, publisher); the model loop on the calling
thread only moves Python objects between queues and the engine, so a Redis round trip never
stalls a step. The engine knows nothing of Redis; this class is the only place the two meet.
``build.py``'s ``build_worker`` makes the parts (connections, threads, the queues between them)
and hands them in.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import KW_ONLY, dataclass, field

import redis
import structlog

from producer.keys import Keys
from producer.protocol import ErrorCode
from producer.status import FinishReason
from worker.engine.llm_engine import InvalidRequestError, LLMEngine
from worker.engine.outputs import RequestOutput
from worker.engine.step_faults import DeviceFault
from worker.service.cancels import CancelListener, EarlyCancels
from worker.service.config import WorkerConfig
from worker.service.deadlines import end_past_deadline
from worker.service.error_codes import error_code
from worker.service.first_token_trace import FirstTokenTrace
from worker.service.inbox import Inbox
from worker.service.intake import Intake
from worker.service.jobs import ActiveJob, AdmittedJob
from worker.service.lease import Lease
from worker.service.metrics import WorkerMetrics
from worker.service.publisher import Command, Publisher, hset
from worker.service.reporting import Reporter
from worker.service.slots import Slots
from worker.service.token_texts import TokenTexts


@dataclass(eq=False)
class JobWorker:
    """The model loop and the parts it runs (``build_worker`` makes them)."""

    engine: LLMEngine
    config: WorkerConfig
    _: KW_ONLY
    inbox: Inbox
    slots: Slots
    intake: Intake
    cancels: CancelListener
    publisher: Publisher
    lease: Lease
    reporter: Reporter
    metrics: WorkerMetrics | None = None
    stop_event: threading.Event = field(default_factory=threading.Event, init=False)

    def __post_init__(self) -> None:
        self.keys = Keys(self.config.prefix)
        self.active = self.inbox.active  # the jobs in the engine, by id
        self._early_cancels = EarlyCancels()
        self._texts = TokenTexts(self.engine.tokenizer)  # logprob tokens' text, at first use
        self._aborts_pending = False  # the engine reports aborts at its next step: take one
        self._stop_at = 0.0
        # Set by a `DeviceFault`: the jobs are handed back, `run` returns, the process exits 70.
        self.device_fault: str | None = None
        # Every line this worker logs names it: several workers often share one log sink.
        self._log = structlog.get_logger("paternoster.worker", worker=self.config.name)
        self._first_tokens = FirstTokenTrace(self._log, self.metrics)

    def run(self) -> None:
        """Serve until ``stop()``; then finish the jobs in hand (for at most ``grace_s``; the
        rest are handed back to other workers) and return."""
        self._join_redis()
        if (switch_ms := self.config.switch_interval_ms) is not None:  # process-wide, lowered only
            sys.setswitchinterval(min(sys.getswitchinterval(), switch_ms / 1000))
        self.lease.start()
        helpers = (self.publisher, self.cancels, self.intake)
        for thread in helpers:
            thread.start()
        if self.metrics is not None:
            self.metrics.watch((*helpers, self.lease))
        self._log.info(
            "worker_started",
            prefix=self.config.prefix,
            capacity=self.slots.capacity,
            stream_interval=self.config.stream_interval,
        )
        try:
            while not (self.stop_event.is_set() and self.inbox.empty):
                if self._grace_over() or self.device_fault is not None:
                    self._hand_back()
                    break
                self.step()
        finally:
            self.intake.stopping.set()
            self.cancels.stopping.set()
            self.publisher.publish(self.reporter.goodbye())
            self.publisher.close()
            self.lease.release()  # after the last write: jobs handed back are taken over now
            # Blocking reads return within read_block_ms; wait so no thread outlives run().
            self.intake.join(timeout=self.config.read_block_ms / 1000 + 5)
            self.cancels.join(timeout=self.config.read_block_ms / 1000 + 5)
            self._log.info("worker_stopped", steps=self.num_steps)

    @property
    def num_steps(self) -> int:
        """Engine steps run so far (the reporter counts them for the heartbeat)."""
        return self.reporter.num_steps

    def _join_redis(self) -> None:
        """Create the groups and take the lease, waiting out a Redis that is away (restarting,
        not up yet): a worker started before its Redis serves once Redis is back."""
        for attempt in range(10**9):
            try:
                self.intake.ensure_group()
                self.lease.renew()
                return
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if self.stop_event.is_set():
                    raise
                delay_s = min(5.0, 0.2 * 2**attempt)
                self._log.warning("redis_unavailable", error=str(exc), retry_in_s=delay_s)
                time.sleep(delay_s)

    def stop(self) -> None:
        """Stop taking jobs; ``run`` returns once the jobs already taken have ended, or after
        ``grace_s`` with the rest handed back."""
        self.intake.stopping.set()
        if not self.stop_event.is_set():
            self._stop_at = time.monotonic()
        self.stop_event.set()
        self.inbox.wake.set()

    def step(self) -> None:
        """One loop iteration: admit, cancel, run one engine step, hand its events over."""
        self._admit()
        self._apply_cancels()
        self._aborts_pending |= end_past_deadline(self.active, self.engine, self._log)
        draining = self.stop_event.is_set()
        if not (self.engine.has_unfinished() or self._aborts_pending):
            self.publisher.publish(self.reporter.heartbeat(draining))
            if self.metrics is not None:
                self.metrics.mark_alive()
            self.inbox.wake.wait(self.config.idle_wait_s)
            self.inbox.wake.clear()
            return
        self._aborts_pending = False
        started, started_at = time.perf_counter(), time.time()
        outputs = self._engine_step()
        commands = self._on_outputs(outputs, started_at)
        for job_id in self.engine.last_preempted:
            if (preempted := self.active.get(job_id)) is not None:
                commands += preempted.on_preempted()
        generated = sum(len(out.new_token_ids) for out in outputs)
        step_s = time.perf_counter() - started
        batched = self.engine.last_num_batched_tokens
        self._first_tokens.stepped(step_s, batched)
        self.reporter.step(self.active, step_s, batched, generated, self.publisher.stats)
        commands += self.reporter.waits(self.active)
        commands += self.reporter.heartbeat(draining)
        self.publisher.publish(commands)

    def _on_outputs(self, outputs: list[RequestOutput], started_at: float) -> list[Command]:
        """The commands of one step's outputs (of the step started at ``started_at``,
        ``time.time()``): token events, and the ends of finished jobs."""
        commands: list[Command] = []
        for out in outputs:
            job = self.active.get(out.request_id)
            if job is None:
                continue
            if out.error is not None:  # it failed inside the step; the others in it go on
                code = error_code(out.error_type)
                why = f"the job failed: {out.error}" if code is ErrorCode.INTERNAL else out.error
                commands += job.fail(code.value, why)
                commands += self._end(job, FinishReason.ERROR)
                continue
            had_token = job.first_token_at is not None
            commands += job.on_output(out)
            if not had_token and job.first_token_at is not None:
                self._first_tokens.first_token(job, self.num_steps, started_at)
            if job.finished:
                commands += self._end(job, out.finish_reason)
        return commands

    def _engine_step(self) -> list[RequestOutput]:
        """``engine.step()``; if it still raises (the engine contains what it can attribute to
        one request), every job in the engine fails with an error event and the worker serves
        on: a worker that died instead would have its jobs resumed elsewhere, where they would
        fail the same way, up to max_deliveries workers."""
        try:
            return self.engine.step()
        except DeviceFault as exc:  # no job's fault: every job goes to another worker
            self._log.error("device_fault_handing_back", jobs=len(self.active), error=str(exc))
            self.device_fault = str(exc)
            self.stop()
            return []
        except Exception as exc:
            self._log.exception("engine_step_failed", jobs=len(self.active), error=repr(exc))
            message = f"the engine step failed: {type(exc).__name__}: {exc}"[:300]
            for job in list(self.active.values()):
                self.engine.abort(job.job.job_id)
                failed = job.fail(ErrorCode.INTERNAL.value, message)  # first: sets the outcome
                self.publisher.publish([*failed, *self._end(job, FinishReason.ERROR)])
            return []

    def _grace_over(self) -> bool:
        if not self.stop_event.is_set():
            return False
        return time.monotonic() - self._stop_at > self.config.grace_s

    def _hand_back(self) -> None:
        """Give the unfinished jobs back without ending them: their blocks are freed, their
        status says so (a handoff is no failed delivery), and once the lease is dropped another
        worker resumes each from its last streamed token."""
        jobs = [j.job for j in self.active.values()]
        while (admitted := self.inbox.next_admitted()) is not None:
            jobs.append(admitted)
        for job in jobs:
            self.engine.abort(job.job_id)
        self.publisher.publish([hset(self.keys.job(j.job_id), {"handoff": 1}) for j in jobs])
        self.active.clear()
        self._log.info("jobs_handed_back", count=len(jobs), job_ids=[j.job_id for j in jobs])

    def _admit(self) -> None:
        while (job := self.inbox.next_admitted()) is not None:
            active = ActiveJob(
                job,
                self.keys,
                self.config.stream_interval,
                self.config.result_ttl_s,
                texts=self._texts,
            )
            if self._early_cancels.pop(job.job_id):
                self.publisher.publish([*active.cancel(), *self._end(active, FinishReason.ABORT)])
            elif self._start(job, active):
                self.active[job.job_id] = active
                self._first_tokens.admitted(active, self.num_steps)
                if self.metrics is not None:
                    queued_s = job.started_at - job.submitted_at
                    self.metrics.job_started(band=job.band, queued_s=queued_s)

    def _start(self, job: AdmittedJob, active: ActiveJob) -> bool:
        """Add ``job`` to the engine; False when it could not start (it has ended, failed)."""
        try:
            self.engine.add_request(job.request)
            return True
        except InvalidRequestError as exc:  # a resume, or a constraint that failed to compile
            failed = active.fail(error_code(type(exc)).value, str(exc))
        except Exception as exc:  # not this worker's process to end
            self._log.exception("job_admit_failed", job_id=job.job_id, error=repr(exc))
            message = f"could not start the job: {exc!r}"[:300]
            failed = active.fail(ErrorCode.INTERNAL.value, message)
        self.publisher.publish([*failed, *self._end(active, FinishReason.ERROR)])
        return False

    def _apply_cancels(self) -> None:
        now = time.monotonic()
        while (job_id := self.inbox.next_cancel()) is not None:
            if job_id in self.active:
                # The engine frees the blocks now and reports the abort in the next step.
                self._aborts_pending |= self.engine.abort(job_id)
                self._log.info(
                    "job_cancel_requested",
                    job_id=job_id,
                    tenant=self.active[job_id].job.request.tenant,
                )
            else:  # not here, or intake has claimed it and not handed it over yet
                self._early_cancels.remember(job_id, now)
        self._early_cancels.expire(now)

    def _end(self, job: ActiveJob, reason: FinishReason | None) -> list[Command]:
        """Forget ``job``, its terminal events already built (the metrics read the outcome they
        set); the commands that clear its wait fields, for the caller to send with those events
        (one round trip a step: sent apart, a step ending 4 jobs took 5 round trips)."""
        self.active.pop(job.job.job_id, None)
        self._first_tokens.forget(job.job.job_id)
        self.slots.give(1)
        self.reporter.job_ended(job)
        self._log.info(
            "job_finished",
            job_id=job.job.job_id,
            tenant=job.job.request.tenant,
            reason=reason,
            completion_tokens=job.num_published_tokens,
            total_s=round(job.now() - job.job.submitted_at, 6),
        )
        return self.reporter.forget(job.job.job_id)
