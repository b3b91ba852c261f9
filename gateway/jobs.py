"""The native API: submit, status, result, cancel and server-sent events over the job plane.

Each route is a thin call into ``AsyncProducer``, through ``tenancy.TenantJobs`` so a caller
behind auth names and sees only its own tenant's ids; the producer's exceptions become HTTP
errors in ``errors.install_error_handlers`` (JobNotFound 404, InvalidJob 422, Overloaded 429
with ``Retry-After``, JobTimeout 504, ...).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from gateway.auth import Caller, caller
from gateway.bodies import StrictJsonRoute
from gateway.errors import ApiError
from gateway.events import EVENT_ID_PATTERN, SSE_HEADERS, SSE_PING, event_sse, follow
from gateway.job_models import CancelOutcome, JobCreated, JobRequest, ResultBody
from gateway.tenancy import TenantJobs
from producer import AsyncProducer, JobStatus

MAX_RESULT_WAIT_S = 3600.0

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=StrictJsonRoute)
CallerDep = Annotated[Caller, Depends(caller)]


def producer_of(request: Request) -> AsyncProducer:
    producer: AsyncProducer = request.app.state.producer
    return producer


def jobs_of(request: Request, who: Caller) -> TenantJobs:
    """The job calls in ``who``'s id namespace: a job of another tenant is no job to it (a
    404, as for an id nobody used: a 403 would tell it that the id exists)."""
    return TenantJobs(producer_of(request), who)


@router.post(
    "",
    status_code=201,
    response_model=JobCreated,
    responses={
        200: {"model": JobCreated, "description": "a job with this id existed"},
        429: {"description": "an admission limit refused the job; retry after Retry-After s"},
    },
)
async def submit_job(body: JobRequest, request: Request, who: CallerDep) -> JSONResponse:
    """Enqueue a job: 201 when created, 200 when a job with ``job_id`` already existed, 429
    (nothing enqueued) when a queue is full: the body says which limit."""
    jobs = jobs_of(request, who)
    spec = body.to_spec(who.tenant_for(body.tenant), jobs.new_job_id(body.job_id))
    job_id, created = await jobs.submit(spec)
    content = JobCreated(job_id=job_id, created=created).model_dump()
    return JSONResponse(content, status_code=201 if created else 200)


@router.get("/{job_id}", response_model=JobStatus)
async def job_status(job_id: str, request: Request, who: CallerDep) -> JobStatus:
    """The job's status hash: state, times, worker, token counts, error."""
    return await jobs_of(request, who).status(job_id)


@router.get("/{job_id}/result", response_model=ResultBody)
async def job_result(
    job_id: str,
    request: Request,
    who: CallerDep,
    timeout_s: Annotated[float, Query(ge=0, le=MAX_RESULT_WAIT_S)] = 30.0,
) -> ResultBody:
    """Wait up to ``timeout_s`` for the job to end: 200 with its text when done; 400/502 for an
    error, 409 for cancelled or expired (the body carries ``state``); 504 when still running."""
    result = await jobs_of(request, who).result(job_id, timeout_s)
    return ResultBody.from_result(result)


@router.post("/{job_id}/cancel", response_model=CancelOutcome)
async def cancel_job(job_id: str, request: Request, who: CallerDep) -> CancelOutcome:
    """Cancel: a queued job ends now, a running one within a step of its worker."""
    outcome = await jobs_of(request, who).cancel(job_id)
    return CancelOutcome(job_id=job_id, outcome=outcome)


@router.get(
    "/{job_id}/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "the job's events"}},
)
async def job_events(
    job_id: str,
    request: Request,
    who: CallerDep,
    from_event: Annotated[str | None, Query(description="resume after this event id")] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> StreamingResponse:
    """The job's events as server-sent events (``id:`` the event id, ``event:`` its type,
    ``data:`` its JSON), from the start or after ``Last-Event-ID`` / ``from_event``, until the
    terminal event."""
    # The header wins: a reconnecting EventSource sends the newest id it saw, while the query
    # string still holds where the page first asked to start.
    start = last_event_id or from_event or "0"
    if not EVENT_ID_PATTERN.match(start):
        raise ApiError(422, f"invalid event id {start!r}: expected e.g. 1700000000000-0")
    jobs = jobs_of(request, who)
    await jobs.status(job_id)
    producer, internal_id = jobs.producer, jobs.job_id(job_id)
    idle_s = request.app.state.config.sse_ping_s

    async def frames() -> AsyncIterator[str]:
        async for event in follow(producer, internal_id, start, idle_s):
            yield SSE_PING if event is None else event_sse(event)

    return StreamingResponse(frames(), media_type="text/event-stream", headers=SSE_HEADERS)
