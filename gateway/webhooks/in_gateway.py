"""``paternoster gateway --webhooks``: a deliverer in the gateway's event loop, on its Redis
client, started and stopped by this router's lifespan (the app's own runs first)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI

from gateway.webhooks.serve import in_gateway


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    if not app.state.config.webhooks:
        yield
        return
    producer: Any = app.state.producer
    async with in_gateway(producer.redis, producer.keys) as deliverer:
        app.state.deliverer = deliverer
        yield


router = APIRouter(lifespan=lifespan)
