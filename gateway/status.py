"""The status page: ``GET /status`` (one HTML file, no CDN) and the JSON it polls, ``/v1/status``.

``/v1/status`` reads what the workers and ``SUBMIT`` already write: each band's queue depth, the
live workers' heartbeats, the most recent job ids with their status hashes, and the webhook
deliveries still to make (``producer.webhook_stats``). It reads the same
keys as ``producer.fleet``, whose readers are flows (``producer.calls``): the gateway runs the same
ones on its asyncio client (a test checks they agree with the sync ones).
"""

from __future__ import annotations

import time
from functools import cache
from pathlib import Path
from typing import Annotated

import redis.asyncio as aredis
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field

from gateway.jobs import CallerDep, jobs_of
from gateway.tenancy import TenantJobs
from producer import AsyncProducer, JobNotFound, JobState, fleet
from producer.calls import adrive, async_io
from producer.fleet import WorkerInfo
from producer.keys import RECENT_KEPT, Keys
from producer.results import JobStatus
from producer.webhook_stats import WebhookCounts, webhook_counts_flow

PAGE = Path(__file__).parent / "static" / "status.html"
# Rows the page shows: 20 fit one screen beside the other tables. With auth the filter runs over
# all 100 ids, so a tenant still sees its own 20 newest when other tenants submit more.
DEFAULT_RECENT = 20

router = APIRouter(tags=["status"])


class WorkerRow(WorkerInfo):
    """A live worker's heartbeat plus what the page shows computed."""

    kv_usage_pct: float = Field(description="KV cache blocks in use, percent")
    heartbeat_age_s: float = Field(description="seconds since the worker's last heartbeat")


class RecentJob(BaseModel):
    job_id: str
    state: str
    tenant: str | None = None
    priority: int | None = None
    completion_tokens: int = Field(0, description="tokens so far (updated every few tokens)")
    wait_reason: str | None = Field(None, description="why a queued job waits, when known")
    position: int | None = Field(None, description="jobs ahead of a queued one (at most)")
    worker: str | None = None
    submitted_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    error_code: str | None = None


class StatusBody(BaseModel):
    """What ``/v1/status`` answers: one snapshot, read in a few round trips."""

    time: float = Field(description="unix seconds when it was read")
    queues: dict[str, int] = Field(description="jobs not yet taken, per band, most urgent first")
    workers: list[WorkerRow]
    recent: list[RecentJob] = Field(description="newest first; with auth only the caller's")
    webhooks: WebhookCounts = Field(description="webhook deliveries behind (docs/webhooks.md)")
    auth: bool = Field(description="bearer auth is on")


async def live_workers(client: aredis.Redis, keys: Keys, now_s: float) -> list[WorkerRow]:
    """``producer.fleet``'s live workers, read on the asyncio client, with the page's fields."""
    infos = await adrive(fleet.live_workers_flow(keys, now_s), async_io(client))
    return [
        WorkerRow(
            **info.model_dump(),
            kv_usage_pct=round(100 * info.kv_usage, 1),
            heartbeat_age_s=round(max(0.0, now_s - info.heartbeat_at), 1),
        )
        for info in infos
    ]


async def queue_depths(client: aredis.Redis, keys: Keys) -> dict[str, int]:
    """``producer.fleet``'s queue depths (the group's lag, else XLEN), on the asyncio client."""
    return await adrive(fleet.queue_depths_flow(keys), async_io(client))


async def recent_jobs(jobs: TenantJobs, limit: int) -> list[RecentJob]:
    """The newest jobs of ``Keys.recent`` still in Redis; with auth only the caller's, under
    the ids it knows them by (``tenancy``)."""
    producer = jobs.producer
    client, keys = producer.redis, producer.keys
    ids: list[str] = await client.lrange(keys.recent, 0, RECENT_KEPT - 1)  # type: ignore[assignment]
    # A resubmitted id may be listed twice: keep the newest.
    ids = [job_id for job_id in dict.fromkeys(ids) if jobs.scope.owns(job_id)]
    pipe = client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hgetall(keys.job(job_id))
    rows = []
    for job_id, fields in zip(ids, await pipe.execute(), strict=True):
        if not fields or "state" not in fields:  # expired since it was listed
            continue
        status = JobStatus.from_hash(job_id, fields)
        if not jobs.caller.may_see(status.tenant):
            continue
        if status.state is JobState.QUEUED:  # why it waits is worked out, not stored
            status = await queued_status(producer, status)
        rows.append(recent_row(status.model_copy(update={"job_id": jobs.shown(job_id)})))
        if len(rows) == limit:
            break
    return rows


async def queued_status(producer: AsyncProducer, status: JobStatus) -> JobStatus:
    """``AsyncProducer.status``, which adds a queued job's ``wait_reason`` and ``position``
    (two round trips each: only the queued jobs of the rows shown pay them)."""
    try:
        return await producer.status(status.job_id)
    except JobNotFound:  # it expired a moment ago: show what was read
        return status


def recent_row(status: JobStatus) -> RecentJob:
    fields = {"job_id", "tenant", "priority", "worker", "submitted_at", "finished_at"}
    fields |= {"finish_reason", "error_code", "wait_reason", "position"}
    return RecentJob(
        **status.model_dump(include=fields),
        state=str(status.state),
        completion_tokens=status.completion_tokens or 0,
    )


@router.get("/v1/status", response_model=StatusBody)
async def fleet_status(
    request: Request,
    who: CallerDep,
    recent: Annotated[int, Query(ge=0, le=RECENT_KEPT)] = DEFAULT_RECENT,
) -> StatusBody:
    """Queues per band, live workers and recent jobs. With auth, any valid token sees the
    queues and workers (they name no tenant) but only its own tenant's jobs."""
    jobs = jobs_of(request, who)
    client, keys, now_s = jobs.producer.redis, jobs.producer.keys, time.time()
    return StatusBody(
        time=now_s,
        queues=await queue_depths(client, keys),
        workers=await live_workers(client, keys, now_s),
        recent=await recent_jobs(jobs, recent),
        webhooks=await adrive(webhook_counts_flow(keys), async_io(client)),
        auth=request.app.state.config.auth_enabled,
    )


@cache
def page_html() -> str:
    return PAGE.read_text(encoding="utf-8")


@router.get("/status", response_class=HTMLResponse, include_in_schema=False)
async def status_page() -> HTMLResponse:
    """The page itself: static, no data in it, so it needs no token (like ``/docs``)."""
    return HTMLResponse(page_html(), headers={"Cache-Control": "no-cache"})
