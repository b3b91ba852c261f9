"""A local receiver that verifies Standard Webhooks signatures on its own (no code of ours),
fails attempts as a test scripts it, and dedupes by ``webhook-id``; and deliverer helpers."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import redis.asyncio as aredis

from gateway.webhooks.config import WebhookConfig
from gateway.webhooks.deliverer import Deliverer
from gateway.webhooks.metrics import WebhookMetrics
from gateway.webhooks.sender import Resolver, system_resolver
from producer.keys import Keys
from producer.protocol import JobSpec

SECRET = "whsec_" + base64.b64encode(b"paternoster-webhook-test-key!").decode()
# Retries in milliseconds, so a test of ten attempts takes well under a second.
FAST = {"backoff_base_s": 0.01, "backoff_max_s": 0.05, "request_timeout_s": 2.0}


def verify(secret: str, headers: Any, body: bytes) -> bool:
    """The receiver's check, written from the spec: HMAC-SHA256 over "id.timestamp.body" with
    the base64-decoded key after whsec_, any one of the space-separated v1 signatures."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    if abs(time.time() - int(headers["webhook-timestamp"])) > 300:  # the spec's replay window
        return False
    sigs = [s.split(",", 1)[1] for s in headers["webhook-signature"].split() if s.startswith("v1,")]
    return any(hmac.compare_digest(expected, s) for s in sigs)


@dataclass
class Receiver:
    """``answer(delivery_id, attempt_no)`` -> (status, headers) decides each reply."""

    answer: Callable[[str, int], tuple[int, dict[str, str]]] = lambda _d, _n: (200, {})
    secret: str = SECRET
    attempts: Counter[str] = field(default_factory=Counter)
    verified: dict[str, dict[str, Any]] = field(default_factory=dict)  # webhook-id -> body
    times: dict[str, list[float]] = field(default_factory=dict)
    hosts: list[str] = field(default_factory=list)  # each attempt's Host header
    bad: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, headers: Any, body: bytes) -> tuple[int, dict[str, str]]:
        did = headers["webhook-id"]
        with self.lock:
            self.attempts[did] += 1
            n = self.attempts[did]
            self.hosts.append(headers["host"])
            self.times.setdefault(did, []).append(time.monotonic())
        if not verify(self.secret, headers, body):
            with self.lock:
                self.bad += 1
            return 401, {}
        status, extra = self.answer(did, n)
        if 200 <= status < 300:
            with self.lock:
                self.verified.setdefault(did, json.loads(body))  # dedupe by webhook-id
        return status, extra

    def by_job(self) -> Counter[str]:
        return Counter(body["data"]["job_id"] for body in self.verified.values())


@contextmanager
def serving(
    receiver: Receiver, tls: ssl.SSLContext | None = None, host: str = "127.0.0.1"
) -> Iterator[str]:
    """The receiver on 127.0.0.1 (allowlisted by the ``allow_loopback`` fixture); its URL, with
    ``host`` in it (a name the test resolves to 127.0.0.1), ``https`` when ``tls`` is given."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            size = int(self.headers["content-length"])
            body = self.rfile.read(size)
            if len(body) < size:  # the sender died mid-request (a deliverer killed -9)
                return
            status, extra = receiver.handle(self.headers, body)
            self.send_response(status)
            for k, v in extra.items():
                self.send_header(k, v)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:  # the handshake runs at accept, on the serving thread
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        scheme = "http" if tls is None else "https"
        yield f"{scheme}://{host}:{server.server_address[1]}/hook"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(autouse=True)
def allow_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATERNOSTER_WEBHOOK_ALLOW", "127.0.0.1")


def cancelled_jobs(redis_url: str, prefix: str, url: str, count: int, **webhook: Any) -> list[str]:
    """``count`` jobs with a webhook to ``url``, cancelled while queued: CANCEL ends each and
    enqueues its terminal delivery, no worker needed."""
    from producer import Producer

    producer = Producer(redis_url, prefix=prefix)
    ids = []
    for _ in range(count):
        hook = {"url": url, "secret": SECRET, **webhook}
        spec = JobSpec.model_validate({"prompt": "hello", "webhook": hook})
        producer.submit_spec(spec).cancel()
        ids.append(spec.id)
    producer.close()
    return ids


async def deliver_until(
    redis_url: str,
    prefix: str,
    done: Callable[[], bool],
    timeout_s: float = 10.0,
    deliverers: int = 1,
    resolve: Resolver = system_resolver,
    **config: Any,
) -> list[Deliverer]:
    """Run deliverers until ``done()`` (checked every 20 ms) or the timeout; then stop them."""
    client = aredis.Redis.from_url(redis_url, decode_responses=True)
    settings = {"read_block_ms": 50, "claim_idle_s": 0.3, **FAST, **config}
    running = [
        Deliverer(
            client,
            Keys(prefix),
            WebhookConfig(**settings),
            metrics=WebhookMetrics(),
            resolve=resolve,
        )
        for _ in range(deliverers)
    ]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(d.run(stop)) for d in running]
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    stop.set()
    await asyncio.gather(*tasks)
    await client.aclose()
    return running
