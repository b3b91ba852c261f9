"""What the workers report about themselves, and how clients read it.

Each worker refreshes a hash ``Keys.worker(name)`` about once a second (``HEARTBEAT_S``) with a
TTL of ``HEARTBEAT_TTL_S``, and its name's score in the ``Keys.workers`` sorted set. A worker
that stops (crash, kill -9, lost network) disappears when its TTL runs out, so a reader never
needs to trust a worker to say goodbye.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from pydantic import BaseModel, ConfigDict

from producer.keys import BANDS, Keys

HEARTBEAT_S = 1.0
# Ten missed beats: long enough to ride out a slow step or a GC pause on a loaded CPU, short
# enough that "no worker" shows within seconds of the last one dying.
HEARTBEAT_TTL_S = 10


class WorkerInfo(BaseModel):
    """One worker's last heartbeat; every field is a hash field of the same name."""

    model_config = ConfigDict(frozen=True)

    name: str
    host: str = ""
    pid: int = 0
    started_at: float = 0.0  # unix s
    heartbeat_at: float = 0.0  # unix s
    model: str = ""
    running: int = 0  # sequences in the running batch
    waiting: int = 0  # sequences taken from Redis, waiting in the worker's queue
    max_num_seqs: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    steps: int = 0
    generated_tokens: int = 0
    preemptions: int = 0
    draining: bool = False  # stopped reading new jobs (shutting down)

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0

    def to_hash(self) -> dict[str, str]:
        return {k: str(int(v) if isinstance(v, bool) else v) for k, v in self.model_dump().items()}

    @classmethod
    def from_hash(cls, fields: dict[str, str]) -> WorkerInfo:
        data: dict[str, Any] = dict(fields)
        if "draining" in data:
            data["draining"] = data["draining"] in ("1", "True", "true")
        return cls.model_validate(data)


def live_workers(client: redis.Redis, keys: Keys, now_s: float | None = None) -> list[WorkerInfo]:
    """Workers whose heartbeat is younger than ``HEARTBEAT_TTL_S``, by name."""
    now_s = time.time() if now_s is None else now_s
    found_names: Any = client.zrangebyscore(keys.workers, now_s - HEARTBEAT_TTL_S, "+inf")
    names: list[str] = list(found_names)
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(keys.worker(name))
    found = [WorkerInfo.from_hash(h) for h in pipe.execute() if h]
    return sorted(found, key=lambda w: w.name)


def queue_depths(client: redis.Redis, keys: Keys) -> dict[str, int]:
    """Entries in each band's jobs stream not yet delivered to any worker, most urgent first.

    Uses the consumer group's ``lag`` (Redis 7); where it is unknown (no group yet, or Redis 6),
    falls back to the stream's length, which also counts delivered, unfinished jobs.
    """
    depths: dict[str, int] = {}
    for band in BANDS:
        stream = keys.band(band)
        lag: int | None = None
        try:
            groups: list[dict[str, Any]] = client.xinfo_groups(stream)
        except redis.ResponseError:  # no such stream yet
            groups = []
        for group in groups:
            if group.get("name") == keys.group and group.get("lag") is not None:
                lag = int(group["lag"])
        depths[band] = lag if lag is not None else int(client.xlen(stream))
    return depths
