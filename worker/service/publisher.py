"""Publishes the model loop's events to Redis on its own thread, one transaction per round trip.

The loop hands over each step's commands and goes on to the next step; this thread sends
everything queued since its last round trip in one buffer (`redis_batch.send_batch`), so Redis
latency overlaps the model and a slow Redis costs round trips, not steps. Commands run in the
order they were queued, on one connection: a job's terminal event is written before its XACK.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import redis
import structlog

from worker.service.redis_batch import send_batch

log = structlog.get_logger("paternoster.publisher")
_STOP = None
RETRY_BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0)  # then 2 s between tries until Redis is back
MARKER_TTL_S = 24 * 3600


@dataclass(frozen=True)
class Command:
    """One Redis command, e.g. ``Command("XADD", (key, "*", "type", "token", ...))``."""

    name: str
    args: tuple[str | int | float, ...]


def xadd(key: str, fields: Mapping[str, str]) -> Command:
    flat: list[str] = []
    for k, v in fields.items():
        flat += [k, v]
    return Command("XADD", (key, "*", *flat))


def hset(key: str, mapping: Mapping[str, str | int | float]) -> Command:
    flat: list[str | int | float] = []
    for k, v in mapping.items():
        flat += [k, v]
    return Command("HSET", (key, *flat))


def expire(key: str, ttl_s: int) -> Command:
    return Command("EXPIRE", (key, ttl_s))


def xack(stream: str, group: str, entry_id: str) -> Command:
    return Command("XACK", (stream, group, entry_id))


@dataclass
class PublishStats:
    round_trips: int = 0
    commands: int = 0
    retries: int = 0


class Publisher(threading.Thread):
    """Each round trip is one MULTI/EXEC that also sets ``marker_key`` to the round trip's
    number: after a connection error the publisher reads the marker to learn whether the lost
    round trip was applied, and sends it again only if not. Events are therefore written
    exactly once, even across a Redis restart (an append-only file keeps a transaction whole).
    """

    def __init__(self, client: redis.Redis, max_backlog: int, marker_key: str = "") -> None:
        super().__init__(name="paternoster-publisher", daemon=True)
        self._redis = client
        self._queue: queue.Queue[Sequence[Command] | None] = queue.Queue(maxsize=max_backlog)
        self.stats = PublishStats()
        self._marker_key = marker_key
        self._run_id = uuid.uuid4().hex[:12]  # a restarted worker's numbers start again
        self._seq = 0

    def publish(self, commands: Sequence[Command]) -> None:
        """Queue one step's commands; waits only when ``max_backlog`` steps are already queued."""
        if commands:
            self._queue.put(commands)

    def flush(self) -> None:
        """Wait until everything queued so far is in Redis."""
        self._queue.join()

    def close(self) -> None:
        self._queue.put(_STOP)
        self.join()

    def run(self) -> None:
        while True:
            first = self._queue.get()
            batches = [first]
            while True:  # merge whatever else is queued into the same round trip
                try:
                    batches.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            commands = [c for b in batches if b is not None for c in b]
            if commands:
                self._send(commands)
            for _ in batches:
                self._queue.task_done()
            if any(b is _STOP for b in batches):
                return

    def _send(self, commands: list[Command]) -> None:
        self._seq += 1
        marker = f"{self._run_id}:{self._seq}"
        for attempt in range(10**9):
            try:
                if attempt and self._applied(marker):
                    break  # the lost reply was for a transaction that ran
                batch = [(c.name, *c.args) for c in commands]
                if self._marker_key:
                    batch.append(("SET", self._marker_key, marker, "EX", MARKER_TTL_S))
                send_batch(self._redis, batch, transaction=bool(self._marker_key))
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self.stats.retries += 1
                delay = RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)]
                log.warning("publish_retry", error=str(exc), delay_s=delay, commands=len(commands))
                time.sleep(delay)
                continue
            except redis.ResponseError as exc:  # a command Redis refused: report, do not loop
                log.error("publish_command_failed", error=str(exc), commands=len(commands))
            except Exception as exc:  # e.g. an argument redis-py cannot encode: the thread lives
                log.exception("publish_failed", error=repr(exc), commands=len(commands))
            break
        self.stats.round_trips += 1
        self.stats.commands += len(commands)

    def _applied(self, marker: str) -> bool:
        return bool(self._marker_key) and self._redis.get(self._marker_key) == marker
