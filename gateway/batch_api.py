"""OpenAI's Batch API: ``/v1/batches`` create, retrieve, list, cancel (docs/gateway.md).

A batch runs its input file's lines as jobs of the ``batch`` band under the caller's tenant
(``batch_runner``); the router's lifespan starts the runner in the gateway's event loop and
puts the file and batch stores on ``app.state`` for these routes and ``files_api``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from pydantic import BaseModel, Field

from gateway.auth import Caller, caller
from gateway.batch_lines import ENDPOINTS
from gateway.batch_runner import BatchRunner
from gateway.batch_store import BatchStatus, BatchStore, new_batch
from gateway.bodies import StrictJsonRoute
from gateway.config import GatewayConfig
from gateway.errors import ApiError
from gateway.files_api import page
from gateway.files_store import FileStore
from producer import AsyncProducer

# The only window OpenAI offers, and how long it is.
COMPLETION_WINDOWS_S = {"24h": 24 * 3600}
MAX_LIST_LIMIT = 100  # OpenAI's largest page of batches
# How long a batch's input file is kept past its window: the jobs in flight at the window's end
# are cancelled and collected after it (within a few polls), by a runner that may parse it again.
INPUT_GRACE_S = 3600
CANCELLABLE = frozenset({BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS})


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """After the app's own lifespan made the producer: the stores, and the runner."""
    producer: AsyncProducer = app.state.producer
    config: GatewayConfig = app.state.config
    app.state.files = FileStore(producer.redis, producer.keys, config.files_dir)
    app.state.batches = BatchStore(producer.redis, producer.keys)
    runner = BatchRunner(producer, config, app.state.metrics)
    task = asyncio.create_task(runner.run()) if config.batch_runner else None
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


router = APIRouter(
    prefix="/v1/batches", tags=["batch"], route_class=StrictJsonRoute, lifespan=lifespan
)
CallerDep = Annotated[Caller, Depends(caller)]


class BatchRequest(BaseModel):
    input_file_id: str
    endpoint: str
    completion_window: str
    # OpenAI's bounds: 16 pairs, keys up to 64 characters, values up to 512.
    metadata: dict[Annotated[str, Field(max_length=64)],
                   Annotated[str, Field(max_length=512)]] | None = Field(
        default=None, max_length=16)  # fmt: skip


def batches_of(request: Request) -> BatchStore:
    store: BatchStore = request.app.state.batches
    return store


@router.post("")
async def create_batch(body: BatchRequest, request: Request, who: CallerDep) -> dict[str, Any]:
    """Start a batch over an uploaded ``purpose=batch`` file; it is ``validating`` at first."""
    if body.endpoint not in ENDPOINTS:
        raise ApiError(422, f"endpoint: one of {', '.join(ENDPOINTS)}", param="endpoint")
    window_s = COMPLETION_WINDOWS_S.get(body.completion_window)
    if window_s is None:
        raise ApiError(422, "completion_window: only 24h", param="completion_window")
    files: FileStore = request.app.state.files
    meta = await files.get(body.input_file_id, who)
    if meta.purpose != "batch":
        raise ApiError(422, "input_file_id: not a purpose=batch file", param="input_file_id")
    window, now = (body.completion_window, window_s), int(time.time())
    # The input outlives the batch: its runner parses it again after a takeover, up to the end.
    await files.extend(meta, now + window_s + INPUT_GRACE_S)
    fields = new_batch(who.tenant or "", body.endpoint, meta.id, window, body.metadata, now)
    store = batches_of(request)
    await store.create(fields)
    return await store.body(await store.read(fields["id"]))


@router.get("")
async def list_batches(
    request: Request,
    who: CallerDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT)] = 20,
) -> dict[str, Any]:
    """The caller's batches, newest first; ``after`` an id of the previous page."""
    found, more = await batches_of(request).list(who, limit, after)
    return page(found, more)


@router.get("/{batch_id}")
async def get_batch(batch_id: str, request: Request, who: CallerDep) -> dict[str, Any]:
    store = batches_of(request)
    return await store.body(await store.get(batch_id, who))


@router.post("/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request, who: CallerDep) -> dict[str, Any]:
    """``cancelling`` until the jobs in flight have ended, then ``cancelled``; what finished
    before is in the output file. A batch already cancelling or cancelled is answered as is;
    one that finished otherwise is a 409."""
    store = batches_of(request)
    fields = await store.get(batch_id, who)
    status = BatchStatus(fields["status"])
    if status in CANCELLABLE:
        await store.move(batch_id, BatchStatus.CANCELLING, int(time.time()))
    fields = await store.get(batch_id, who)
    status = BatchStatus(fields["status"])
    if status not in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
        raise ApiError(409, f"batch {batch_id} is {status}: it can no longer be cancelled",
                       code="batch_not_cancellable")  # fmt: skip
    return await store.body(fields)
