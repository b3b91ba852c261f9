"""Cancel requests of running jobs: heard on their stream, and remembered until their job shows.

Every worker reads the whole cancels stream (no consumer group): a running job's cancel must
reach the one worker that holds it, and only that worker knows it does. Starting from the
stream's current end, a cancel written before this worker started cannot concern its jobs.
A cancel can also arrive between intake's claim of a job and the model loop taking it over;
``EarlyCancels`` keeps it, for a while, so that job ends as soon as the loop sees it.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import redis
import structlog

from producer.keys import Keys

log = structlog.get_logger("paternoster.cancels")
EARLY_CANCEL_TTL_S = 60.0  # how long a cancel for a job not (yet) seen here is remembered


class CancelListener(threading.Thread):
    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        out: queue.Queue[str],
        wake: threading.Event,
        block_ms: int,
    ) -> None:
        super().__init__(name="paternoster-cancels", daemon=True)
        self._redis = client
        self._keys = keys
        self._out = out
        self._wake = wake
        self._block_ms = block_ms
        self.stopping = threading.Event()
        # "$" is resolved to a concrete id at the first read (a later XREAD from "$" would skip
        # entries written between two reads); not here, so a worker can start while its Redis
        # is away.
        self._last_id: str | None = None

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                if self._last_id is None:
                    last: Any = self._redis.xrevrange(self._keys.cancels, count=1)
                    self._last_id = last[0][0] if last else "0-0"
                reply: Any = self._redis.xread(
                    {self._keys.cancels: self._last_id}, count=256, block=self._block_ms
                )
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("cancel_read_failed", error=str(exc))
                time.sleep(1.0)
                continue
            except Exception as exc:  # this thread must outlive any reply (NOGROUP-like, bugs)
                log.exception("cancel_read_failed", error=repr(exc))
                time.sleep(1.0)
                continue
            for entry_id, fields in reply[0][1] if reply else []:
                self._last_id = entry_id
                if fields.get("id"):
                    self._out.put(fields["id"])
            if reply:
                self._wake.set()


class EarlyCancels:
    """Cancels of jobs the model loop does not run (yet): most belong to other workers, a few
    to jobs intake has claimed and not handed over. Kept oldest first for ``ttl_s``."""

    def __init__(self, ttl_s: float = EARLY_CANCEL_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._heard_at: dict[str, float] = {}  # job id -> when; insertion order is age order

    def remember(self, job_id: str, now: float) -> None:
        self._heard_at.pop(job_id, None)  # re-insert: the dict stays oldest-first
        self._heard_at[job_id] = now

    def pop(self, job_id: str) -> bool:
        """Whether a cancel for ``job_id`` was heard (and is forgotten now)."""
        return self._heard_at.pop(job_id, None) is not None

    def expire(self, now: float) -> None:
        """Forget the cancels older than ``ttl_s``. Every worker hears every cancel in the
        cluster, so they go from the oldest end instead of a scan of all of them each step."""
        while self._heard_at:
            oldest = next(iter(self._heard_at))
            if now - self._heard_at[oldest] <= self.ttl_s:
                break
            del self._heard_at[oldest]

    def __len__(self) -> int:
        return len(self._heard_at)
