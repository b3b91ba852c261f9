"""Listens for cancel requests of running jobs and hands their ids to the model loop.

Every worker reads the whole cancels stream (no consumer group): a running job's cancel must
reach the one worker that holds it, and only that worker knows it does. Starting from the
stream's current end, a cancel written before this worker started cannot concern its jobs.
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
