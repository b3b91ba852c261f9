"""``create_app``: the FastAPI application, one ``AsyncProducer`` shared by every request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from gateway import batch_api, files_api, jobs, metrics, openai_api
from gateway.bodies import BodyLimit
from gateway.config import GatewayConfig
from gateway.errors import install_error_handlers
from gateway.status import router as status_router
from gateway.webhooks.in_gateway import router as webhooks_router
from producer import AsyncProducer


def create_app(config: GatewayConfig | None = None) -> FastAPI:
    """The gateway for ``config`` (default: from the environment). Redis is connected at
    startup, inside the server's event loop, since an asyncio client belongs to one loop."""
    config = config or GatewayConfig.from_env()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        producer = AsyncProducer(config.redis_url, prefix=config.prefix, reconnect=config.reconnect)
        app.state.producer = producer
        try:
            yield
        finally:
            await producer.aclose()

    app = FastAPI(
        title="Paternoster gateway",
        summary="Generation jobs over Redis Streams: a native job API and an OpenAI-compatible one",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.metrics = metrics.GatewayMetrics()  # /metrics; the batch runner counts on it
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_body_bytes=config.max_body_bytes)
    app.include_router(jobs.router)
    app.include_router(openai_api.router)
    app.include_router(files_api.router)  # the Batch API's files
    app.include_router(batch_api.router)  # its lifespan starts the batch runner
    app.include_router(status_router)  # /status page and /v1/status
    app.include_router(webhooks_router)  # its lifespan runs a deliverer if config.webhooks
    app.include_router(metrics.router)  # /metrics: the registry above, the deliverer's too
    return app
