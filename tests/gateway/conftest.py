"""Fixtures for the gateway: a worker on the tiny model and gateways served by uvicorn.

Everything here is per session: one worker and four gateways (plain, with bearer auth, and two
on a prefix no worker reads, whose jobs stay queued, one of them with auth) serve every gateway
test, since an engine and a server cost about a second each to start and the tests share
nothing but job ids.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
import uvicorn

from gateway.app import create_app
from gateway.config import GatewayConfig
from tests.service.conftest import running_worker, tiny_engine

TOKENS = {"tok-a": "tenant-a", "tok-b": "tenant-b"}


@dataclass
class Served:
    """A gateway served on a free local port; ``url`` is its base URL."""

    url: str
    server: uvicorn.Server
    thread: threading.Thread

    def client(self, token: str | None = None, timeout_s: float = 30.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)


def serve(config: GatewayConfig) -> Served:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(config), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "gateway did not start"
        time.sleep(0.02)
    return Served(f"http://127.0.0.1:{port}", server, thread)


def stop(served: Served) -> None:
    served.server.should_exit = True
    served.thread.join(timeout=10)


@pytest.fixture(scope="package")
def gw_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix for this package's jobs; its keys (and the idle prefix's) go afterwards."""
    prefix = f"pn-gw-{uuid.uuid4().hex[:10]}"
    yield prefix
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    for pattern in (f"{prefix}:*", f"{prefix}-idle:*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)
    client.close()


@pytest.fixture(scope="package")
def gateway(redis_url: str, gw_prefix: str, tiny_model_dir: Path) -> Iterator[Served]:
    """The plain gateway, with a worker on the tiny model behind it."""
    with running_worker(tiny_engine(tiny_model_dir), redis_url, gw_prefix):
        served = serve(GatewayConfig(redis_url=redis_url, prefix=gw_prefix))
        yield served
        stop(served)


@pytest.fixture(scope="package")
def auth_gateway(
    redis_url: str, gw_prefix: str, gateway: Served, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """A gateway with bearer auth (tokens from a file), on the same worker."""
    path = tmp_path_factory.mktemp("gw") / "tokens.json"
    path.write_text(json.dumps(TOKENS))
    config = GatewayConfig.from_env(str(path), redis_url=redis_url, prefix=gw_prefix)
    served = serve(config)
    yield served
    stop(served)


@pytest.fixture(scope="package")
def idle_gateway(redis_url: str, gw_prefix: str) -> Iterator[Served]:
    """A gateway on a prefix no worker reads: its jobs stay queued until cancelled. Short
    timeouts so a waiting request ends quickly."""
    config = GatewayConfig(
        redis_url=redis_url, prefix=f"{gw_prefix}-idle", request_timeout_s=1.0, sse_ping_s=0.5
    )
    served = serve(config)
    yield served
    stop(served)


@pytest.fixture(scope="package")
def idle_auth_gateway(redis_url: str, gw_prefix: str) -> Iterator[Served]:
    """The idle gateway's prefix (no worker) behind bearer auth: jobs stay queued."""
    config = GatewayConfig(
        redis_url=redis_url, prefix=f"{gw_prefix}-idle", tokens=TOKENS, request_timeout_s=1.0
    )
    served = serve(config)
    yield served
    stop(served)


def parse_sse(lines: Iterator[str]) -> Iterator[dict[str, str]]:
    """Server-sent events as dicts of their fields (``id``, ``event``, ``data``); comments
    (keep-alive pings) skipped."""
    fields: dict[str, str] = {}
    for line in lines:
        if not line:
            if fields:
                yield fields
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
