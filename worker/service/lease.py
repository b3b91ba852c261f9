"""The worker's lease: while it renews ``Keys.lease(name)``, no other worker touches its jobs.

Renewed from its own thread and connection, once a second with a 10 s TTL, so a long engine
step (a 2k-token prefill on a CPU takes seconds) never looks like a death: a job is reclaimed
only when the process holding it stopped renewing (killed, crashed, cut off from Redis), never
because it has run long. Whether the model loop itself is alive is a separate question,
answered by ``/health`` (``metrics.py``) and the heartbeat's ``heartbeat_at``.
"""

from __future__ import annotations

import threading

import redis
import structlog

from producer.keys import Keys

log = structlog.get_logger("paternoster.lease")
LEASE_RENEW_S = 1.0
# Ten renewals: a Redis restart or a network blip of a few seconds does not lose the lease.
LEASE_TTL_S = 10


class Lease(threading.Thread):
    def __init__(self, client: redis.Redis, keys: Keys, name: str) -> None:
        super().__init__(name="paternoster-lease", daemon=True)
        self._redis = client
        self._key = keys.lease(name)
        self._name = name
        self.stopping = threading.Event()

    def renew(self) -> None:
        self._redis.set(self._key, self._name, ex=LEASE_TTL_S)

    def run(self) -> None:
        while not self.stopping.wait(LEASE_RENEW_S):
            try:
                self.renew()
            except redis.RedisError as exc:  # retried next second; the TTL covers the gap
                log.warning("lease_renew_failed", error=str(exc))

    def release(self) -> None:
        """Stop renewing and drop the lease now, so other workers reclaim what is left at once
        instead of after the TTL (a graceful stop hands its unfinished jobs over this way)."""
        self.stopping.set()
        try:
            self._redis.delete(self._key)
        except redis.RedisError as exc:  # then the TTL hands them over, 10 s later
            log.warning("lease_release_failed", error=str(exc))
