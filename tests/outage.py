"""Clients across a Redis outage: a fake worker publishes part of a job on a redis-server of the
test's own, the server restarts (or stops) while a client reads, then the rest is published.

The client under test runs in the test's thread; the outage runs in a ``Background`` thread, so
it happens while the client is blocked in ``XREAD``, as in production.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import redis

from ops.bench.redis_server import RedisServer
from producer import Keys
from producer.protocol import Event, TokenEvent
from tests.producer.fake_worker import FakeJob, FakeWorker

PREFIX = "pn-outage"
# Before the restart: long enough for the client to be waiting in XREAD, so the restart cuts
# a blocked read (the case that used to raise), not an idle pool.
READING_S = 0.2
DOWN_S = 0.5  # the outage: several of the clients' backoff steps


class Background(threading.Thread):
    """``fn`` in a thread; ``result()`` joins it and re-raises what it raised."""

    def __init__(self, fn: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self.fn = fn
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.fn()
        except BaseException as exc:  # handed to the test's thread by result()
            self.error = exc

    def result(self, timeout_s: float = 30.0) -> None:
        self.join(timeout_s)
        assert not self.is_alive(), "the outage thread did not finish"
        if self.error is not None:
            raise self.error


class OutageWorker:
    """A fake worker on ``server`` that publishes one job around a restart of the server."""

    def __init__(self, server: RedisServer, prefix: str = PREFIX) -> None:
        self.server = server
        self.client = redis.Redis.from_url(server.url, decode_responses=True)
        self.worker = FakeWorker(self.client, Keys(prefix))
        self.job: FakeJob | None = None

    def take(self, num_tokens: int) -> str:
        """Claim the next job and publish its first ``num_tokens`` tokens; the job's id."""
        self.job = self.worker.take(block_ms=5000)
        self.publish(num_tokens)
        return self.job.job_id

    def publish(self, num_tokens: int) -> None:
        assert self.job is not None
        for _ in range(num_tokens):
            i = self.job.next_index
            self.worker.token(self.job, f"t{i} ", [i])

    def restart_then_finish(self, num_tokens: int, down_s: float = DOWN_S) -> None:
        """Restart the server (SIGTERM: the append-only file is synced), then publish
        ``num_tokens`` more tokens and ``done``."""
        assert self.job is not None
        time.sleep(READING_S)
        self.server.restart(down_s=down_s)
        self.publish(num_tokens)
        self.worker.done(self.job)

    def close(self) -> None:
        self.client.close()


def text_of(num_tokens: int) -> str:
    """What ``OutageWorker`` publishes for a job of ``num_tokens`` tokens."""
    return "".join(f"t{i} " for i in range(num_tokens))


def check_once_in_order(events: Sequence[Event], num_tokens: int) -> None:
    """``started``, tokens 0..num_tokens-1 each once and in order, then ``done`` only."""
    assert [e.type for e in events] == ["started"] + ["token"] * num_tokens + ["done"]
    indices = [e.index for e in events if isinstance(e, TokenEvent)]
    assert indices == list(range(num_tokens))
    ids = [tuple(map(int, str(e.event_id).split("-"))) for e in events]
    assert ids == sorted(set(ids)), "event ids repeat or go backwards"
