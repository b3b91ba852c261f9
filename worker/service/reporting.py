"""What the worker tells the world each step, besides tokens: why jobs wait, that it is alive,
and its metrics. It only builds commands and feeds counters; the publisher sends them.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections import Counter
from collections.abc import Mapping

from producer.fleet import HEARTBEAT_S, HEARTBEAT_TTL_S, StepCostReport, WorkerInfo
from producer.keys import BANDS, Keys
from worker.engine.llm_engine import LLMEngine
from worker.engine.scheduler import Scheduler
from worker.engine.step_targets import format_tpot_targets
from worker.service.jobs import ActiveJob
from worker.service.metrics import WorkerMetrics
from worker.service.publisher import Command, PublishStats, hset

# A waiting job's reason and position are written when they change, but at most this often:
# a queue of 70 jobs moving one place per admission would otherwise cost 70 writes per step.
WAIT_UPDATE_S = 0.25

WaitFields = tuple[str, int, int]  # reason, position, preemptions


class Reporter:
    def __init__(
        self, engine: LLMEngine, keys: Keys, name: str, metrics: WorkerMetrics | None
    ) -> None:
        self.engine = engine
        self.keys = keys
        self.name = name
        self.metrics = metrics
        self.started_at = time.time()
        self._published: dict[str, WaitFields] = {}  # job id -> what its status hash says
        self._next_wait_update = 0.0
        self._next_heartbeat = 0.0
        self._preemptions_seen: Counter[str] = Counter()
        self.num_steps = 0
        self.generated_tokens = 0
        self._counted = PublishStats()  # publisher and prefix-cache totals already exported
        self._cache_seen = (0, 0)

    # -- waiting jobs ------------------------------------------------------------------------

    def waits(self, active: Mapping[str, ActiveJob]) -> list[Command]:
        """Status-hash updates for jobs whose wait reason, position or preemptions changed."""
        now = time.monotonic()
        if now < self._next_wait_update:
            return []
        self._next_wait_update = now + WAIT_UPDATE_S
        infos = self.engine.wait_info()
        commands: list[Command] = []
        reasons: Counter[str] = Counter()
        for job_id, info in infos.items():
            job = active.get(job_id)
            if job is None:
                continue
            reasons[info.reason.value] += 1
            fields = (info.reason.value, info.position, job.num_preemptions)
            if self._published.get(job_id) != fields:
                self._published[job_id] = fields
                reason, position, preemptions = fields
                mapping: dict[str, str | int | float] = {
                    "wait_reason": reason,
                    "position": position,
                    "preemptions": preemptions,
                }
                commands.append(hset(self.keys.job(job_id), mapping))
        for job_id in [j for j in self._published if j not in infos]:
            del self._published[job_id]
            if job_id in active:  # admitted now: it no longer waits
                commands.append(self._clear_wait(job_id))
        if self.metrics is not None:
            for reason, count in reasons.items():
                self.metrics.waiting_reason(reason=reason, count=count)
        return commands

    def forget(self, job_id: str) -> list[Command]:
        """A job ended: clear its wait fields if they were ever written."""
        if self._published.pop(job_id, None) is None:
            return []
        return [self._clear_wait(job_id)]

    def _clear_wait(self, job_id: str) -> Command:
        return Command("HDEL", (self.keys.job(job_id), "wait_reason", "position"))

    # -- metrics -----------------------------------------------------------------------------

    def job_ended(self, job: ActiveJob) -> None:
        """A job's end in the metrics: its outcome, end-to-end time, time per output token."""
        if self.metrics is None:
            return
        end = job.now()
        tokens = job.num_published_tokens
        tpot_s = None
        if job.first_token_at is not None and tokens > 1:
            tpot_s = (end - job.first_token_at) / (tokens - 1)
        self.metrics.job_finished(
            band=job.job.band,
            outcome=job.outcome or "",
            finish_reason=job.finish_reason,
            e2e_s=end - job.job.submitted_at,
            tpot_s=tpot_s,
            completion_tokens=tokens,
        )

    def step(
        self,
        active: Mapping[str, ActiveJob],
        step_s: float,
        num_batched: int,
        generated: int,
        published: PublishStats,
    ) -> None:
        self.num_steps += 1
        self.generated_tokens += generated
        if self.metrics is None:
            return
        self._counters(self.metrics, published)
        bm = self.engine.block_manager
        sched = self.engine.scheduler
        self.metrics.step(
            num_running=len(sched.running),
            num_waiting=len(sched.waiting),
            num_batched_tokens=num_batched,
            num_generated_tokens=generated,
            kv_blocks_used=bm.num_blocks - bm.num_free_blocks,
            kv_blocks_total=bm.num_blocks,
            step_s=step_s,
        )
        for reason, total in sched.preemptions_by_reason.items():
            new = total - self._preemptions_seen[reason]
            if new:
                self.metrics.preempted(reason=reason, count=new)
                self._preemptions_seen[reason] = total
        running_ids = {s.request_id for s in sched.running}
        held: dict[str, Counter[str]] = {band: Counter() for band in BANDS}
        for job_id, job in active.items():
            held[job.job.band]["running" if job_id in running_ids else "waiting"] += 1
        for band, counts in held.items():
            self.metrics.jobs_held(band=band, waiting=counts["waiting"], running=counts["running"])

    def _counters(self, metrics: WorkerMetrics, published: PublishStats) -> None:
        """Export what the publisher and the prefix cache counted since the last step."""
        done = self._counted
        metrics.publish(
            round_trips=published.round_trips - done.round_trips,
            commands=published.commands - done.commands,
            retries=published.retries - done.retries,
        )
        self._counted = PublishStats(published.round_trips, published.commands, published.retries)
        stats = self.engine.cache_stats()
        queried, hit = stats.num_query_tokens, stats.num_hit_tokens
        metrics.prefix_cache(
            queried_tokens=queried - self._cache_seen[0], hit_tokens=hit - self._cache_seen[1]
        )
        self._cache_seen = (queried, hit)

    # -- heartbeat -------------------------------------------------------------------------------

    def heartbeat(self, draining: bool, force: bool = False) -> list[Command]:
        """This worker's ``WorkerInfo`` about once a second (see ``producer.fleet``)."""
        now = time.monotonic()
        if not force and now < self._next_heartbeat:
            return []
        self._next_heartbeat = now + HEARTBEAT_S
        bm = self.engine.block_manager
        sched = self.engine.scheduler
        info = WorkerInfo(
            name=self.name,
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=self.started_at,
            heartbeat_at=time.time(),
            model=str(self.engine.model_dir.name),
            running=len(sched.running),
            waiting=len(sched.waiting),
            max_num_seqs=self.engine.config.scheduler.max_num_seqs,
            kv_blocks_used=bm.num_blocks - bm.num_free_blocks,
            kv_blocks_total=bm.num_blocks,
            steps=self.num_steps,
            generated_tokens=self.generated_tokens,
            preemptions=sched.num_preemptions,
            draining=draining,
            step_cost=step_cost_report(sched),
        )
        key = self.keys.worker(self.name)
        return [
            hset(key, info.to_hash()),
            Command("EXPIRE", (key, HEARTBEAT_TTL_S)),
            Command("ZADD", (self.keys.workers, info.heartbeat_at, self.name)),
        ]

    def goodbye(self) -> list[Command]:
        return [
            Command("DEL", (self.keys.worker(self.name),)),
            Command("ZREM", (self.keys.workers, self.name)),
        ]


def step_cost_report(sched: Scheduler) -> StepCostReport:
    """What ``paternoster top`` shows of the step-cost model (``WorkerInfo.step_cost``)."""
    fit, model, allowance = sched.step_cost.last_fit, sched.step_cost, sched.last_allowance
    return StepCostReport(
        **{f.name: float(getattr(fit, f.name)) for f in dataclasses.fields(fit)},
        measured_s=model.last_step_s,
        predicted_s=model.last_predicted_s,
        target_s=allowance.target_s if allowance is not None else 0.0,
        targets=format_tpot_targets(sched.config.tpot_target_ms),
    )
