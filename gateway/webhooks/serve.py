"""Running a deliverer: on its own (``paternoster webhooks``) or inside the gateway's event
loop (``paternoster gateway --webhooks``), with its metrics served when asked."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import redis.asyncio as aredis

from gateway.webhooks.config import WebhookConfig
from gateway.webhooks.deliverer import Deliverer
from gateway.webhooks.metrics import WebhookMetrics
from producer.connection import resolve_redis_url
from producer.keys import Keys

log = logging.getLogger("paternoster.webhooks")


async def serve(
    redis_url: str | None,
    keys: Keys,
    config: WebhookConfig,
    stop: asyncio.Event,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
) -> None:
    """Deliver until ``stop`` is set."""
    url, embedded = resolve_redis_url(redis_url)
    client = aredis.Redis.from_url(url, decode_responses=True)
    metrics = WebhookMetrics()
    deliverer = Deliverer(client, keys, config, metrics=metrics)
    server = None
    if metrics_port is not None:
        from worker.service.metrics_server import MetricsServer  # prometheus_client only

        def health() -> tuple[int, dict[str, object]]:
            return 200, {"in_flight": deliverer.in_flight}

        server = MetricsServer(metrics_host, metrics_port, render=metrics.render, health=health)
        log.info("webhooks: metrics on http://%s:%d/metrics", metrics_host, server.port)
    try:
        log.info("webhooks: delivering from %s as %s", keys.webhooks, config.name)
        await deliverer.run(stop)
    finally:
        if server is not None:
            server.close()
        await client.aclose()
        if embedded is not None:
            embedded.close()


@contextlib.asynccontextmanager
async def in_gateway(client: aredis.Redis, keys: Keys) -> AsyncIterator[Deliverer]:
    """A deliverer on the gateway's event loop and Redis client, for the app's lifespan."""
    deliverer = Deliverer(client, keys, WebhookConfig(), metrics=WebhookMetrics())
    stop = asyncio.Event()
    task = asyncio.create_task(deliverer.run(stop), name="webhooks")
    try:
        yield deliverer
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=WebhookConfig().read_block_ms / 1000 + 5)
