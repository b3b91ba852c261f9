"""One frame of ``paternoster top``: what a deployment is doing, read from Redis only.

``build_snapshot`` is the only function here that talks to Redis: about nine round trips
(live workers 2, queue depths 3 to 6, webhook counts 1, recent ids 1, their status hashes 1
pipelined, and 2 more when some recent job is still queued), so a 1 s refresh costs Redis
nothing noticeable. The rest turns what it read into plain numbers that the renderer and
``--json`` share.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import redis
from pydantic import ValidationError

from producer import waiting
from producer.fleet import StepCostReport, WorkerInfo, live_workers, queue_depths
from producer.keys import Keys, band_of
from producer.protocol import JobState
from producer.results import JobStatus
from producer.webhook_stats import WebhookCounts, webhook_counts

# Keys.recent holds at most 100 ids; read them all so the percentiles cover every recent job.
RECENT_LIMIT = 100


@dataclass(frozen=True)
class WorkerRow:
    """One live worker, from its heartbeat hash (``fleet.WorkerInfo``)."""

    name: str
    model: str
    running: int
    max_num_seqs: int
    waiting: int
    kv_usage: float  # 0 to 1
    steps: int
    generated_tokens: int
    tokens_per_s: float | None  # None: no earlier heartbeat of it to compare with
    heartbeat_at: float  # unix s, the worker's clock
    heartbeat_age_s: float
    draining: bool
    step_cost: StepCostReport | None = None  # what it thinks a step costs; None: not said


@dataclass(frozen=True)
class JobRow:
    """One recent job, from its status hash; times in seconds, None where not reached yet."""

    job_id: str
    tenant: str | None
    priority: int | None
    state: str
    wait_reason: str | None
    position: int | None
    completion_tokens: int | None
    ttft_s: float | None  # first token - submitted
    total_s: float | None  # finished - submitted
    worker: str | None
    preemptions: int | None


@dataclass(frozen=True)
class Latency:
    """Percentiles over the recent jobs that ended ``done`` (nearest rank; None: no such job)."""

    finished: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p99_s: float | None


@dataclass(frozen=True)
class Snapshot:
    prefix: str
    taken_at: float  # unix s, this machine's clock
    queue_depths: Mapping[str, int]  # band -> entries no worker has read yet, urgent first
    workers: tuple[WorkerRow, ...]
    jobs: tuple[JobRow, ...]  # newest first
    latency: Latency
    webhooks: WebhookCounts  # deliveries behind (``producer.webhook_stats``)

    def to_json(self) -> dict[str, Any]:
        fields = asdict(self)
        fields["queue_depths"] = dict(self.queue_depths)
        fields["webhooks"] = self.webhooks.model_dump()
        return fields


def build_snapshot(
    client: redis.Redis,
    keys: Keys,
    previous: Snapshot | None = None,
    now_s: float | None = None,
    limit: int = RECENT_LIMIT,
) -> Snapshot:
    """Read one frame. ``previous`` (the last frame) gives each worker's tokens/s."""
    now_s = time.time() if now_s is None else now_s
    infos = live_workers(client, keys, now_s)
    depths = queue_depths(client, keys)
    hooks = webhook_counts(client, keys)
    statuses = _recent_statuses(client, keys, limit)
    before = {w.name: w for w in previous.workers} if previous is not None else {}
    workers = tuple(_worker_row(info, before.get(info.name), now_s) for info in infos)
    jobs = tuple(_job_row(status) for status in statuses)
    return Snapshot(keys.prefix, now_s, depths, workers, jobs, latency_of(jobs), hooks)


def tokens_per_s(info: WorkerInfo, before: WorkerRow | None) -> float | None:
    """The change in ``generated_tokens`` over the change in ``heartbeat_at``.

    The heartbeat's own time, not the refresh time: a worker beats about once a second, so a
    1 s refresh sees the same beat twice now and then and would show 0, then double. Same beat
    as last frame: the last rate stands. Fewer tokens than before: a restart under the same
    name, no rate until the next beat."""
    if before is None:
        return None
    elapsed_s = info.heartbeat_at - before.heartbeat_at
    if elapsed_s <= 0:
        return before.tokens_per_s
    generated = info.generated_tokens - before.generated_tokens
    return generated / elapsed_s if generated >= 0 else None


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest rank: the smallest value with at least ``p`` % of the values at or below it.
    With fewer than 100 values p99 is the maximum, which is what a small sample can say."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def latency_of(jobs: Sequence[JobRow]) -> Latency:
    done = [j for j in jobs if j.state == JobState.DONE.value]
    ttfts = [j.ttft_s for j in done if j.ttft_s is not None]
    totals = [j.total_s for j in done if j.total_s is not None]
    return Latency(
        finished=len(done),
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p99_s=percentile(ttfts, 99),
        e2e_p50_s=percentile(totals, 50),
        e2e_p99_s=percentile(totals, 99),
    )


def _worker_row(info: WorkerInfo, before: WorkerRow | None, now_s: float) -> WorkerRow:
    return WorkerRow(
        name=info.name,
        model=info.model,
        running=info.running,
        max_num_seqs=info.max_num_seqs,
        waiting=info.waiting,
        kv_usage=info.kv_usage,
        steps=info.steps,
        generated_tokens=info.generated_tokens,
        tokens_per_s=tokens_per_s(info, before),
        heartbeat_at=info.heartbeat_at,
        heartbeat_age_s=max(0.0, now_s - info.heartbeat_at),
        draining=info.draining,
        step_cost=info.step_cost,
    )


def _job_row(status: JobStatus) -> JobRow:
    submitted = status.submitted_at
    return JobRow(
        job_id=status.job_id,
        tenant=status.tenant,
        priority=status.priority,
        state=status.state.value,
        wait_reason=status.wait_reason,
        position=status.position,
        completion_tokens=status.completion_tokens,
        ttft_s=_since(submitted, status.first_token_at),
        total_s=_since(submitted, status.finished_at),
        worker=status.worker,
        preemptions=status.preemptions,
    )


def _since(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else max(0.0, end - start)


def _recent_statuses(client: redis.Redis, keys: Keys, limit: int) -> list[JobStatus]:
    """The recent jobs' statuses, newest first; a queued one also gets its wait reason and
    position, as ``Producer.status`` computes them. Ids whose hash expired are skipped."""
    found_ids: Any = client.lrange(keys.recent, 0, limit - 1)
    ids = [str(i) for i in found_ids]
    pipe = client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hgetall(keys.job(job_id))
    statuses: list[JobStatus] = []
    stream_ids: dict[str, str] = {}
    for job_id, fields in zip(ids, pipe.execute(), strict=True):
        if not fields:
            continue
        try:
            status = JobStatus.from_hash(job_id, fields)
        except ValidationError:  # a hash written by hand or by a newer version: skip the row
            continue
        statuses.append(status)
        if status.state is JobState.QUEUED and "stream_id" in fields:
            stream_ids[job_id] = fields["stream_id"]
    if not stream_ids:
        return statuses
    waits = _queued_waits(client, keys, statuses, stream_ids)
    return [s if s.job_id not in waits else s.model_copy(update=waits[s.job_id]) for s in statuses]


def _queued_waits(
    client: redis.Redis, keys: Keys, statuses: Sequence[JobStatus], stream_ids: Mapping[str, str]
) -> dict[str, dict[str, Any]]:
    """``producer.waiting`` for every queued job at once: two pipelined round trips in all."""
    pipe = client.pipeline(transaction=False)
    waiting.ask_fleet(pipe, keys)
    names, queues = waiting.read_fleet(pipe.execute(raise_on_error=False), keys)
    queued = [s for s in statuses if s.job_id in stream_ids]
    pipe = client.pipeline(transaction=False)
    for status in queued:
        band = status.band or band_of(status.priority or 0)
        waiting.ask_position(pipe, keys, names, band, queues[band], stream_ids[status.job_id])
    replies = pipe.execute(raise_on_error=False)
    per_job = len(names) + 1  # ask_position: one EXISTS per worker name, one XRANGE
    waits: dict[str, dict[str, Any]] = {}
    for i, status in enumerate(queued):
        band = status.band or band_of(status.priority or 0)
        wait = waiting.waiting(replies[i * per_job : (i + 1) * per_job], names, band, queues)
        waits[status.job_id] = {"wait_reason": wait.wait_reason, "position": wait.position}
    return waits
