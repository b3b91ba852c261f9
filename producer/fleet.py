"""What the workers report about themselves, and how clients read it.

Each worker refreshes a hash ``Keys.worker(name)`` about once a second (``HEARTBEAT_S``) with a
TTL of ``HEARTBEAT_TTL_S``, and its name's score in the ``Keys.workers`` sorted set. A worker
that stops (crash, kill -9, lost network) disappears when its TTL runs out, so a reader never
needs to trust a worker to say goodbye.

Each reader is a flow (``producer.calls``): the functions here run it on a redis-py client, the
gateway runs the same on its asyncio one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from pydantic import BaseModel, ConfigDict

from producer.calls import IO, Command, Flow, Pipeline, drive
from producer.keys import BANDS, Keys

HEARTBEAT_S = 1.0
# Ten missed beats: long enough to ride out a slow step or a GC pause on a loaded CPU, short
# enough that "no worker" shows within seconds of the last one dying.
HEARTBEAT_TTL_S = 10


@dataclass(frozen=True)
class StepCostReport:
    """What a worker thinks a step costs (its step-cost model, worker/engine/step_cost.py), in
    seconds: each fitted term of ``StepCost`` under its own name, the last step measured and as
    predicted before it ran, the TPOT target it was sized to (0: none, the whole token budget),
    and the targets in force as ``--tpot-target-ms`` takes them ("off": none)."""

    base_s: float
    per_decode_s: float
    per_prefill_token_s: float
    per_context_token_s: float
    measured_s: float
    predicted_s: float
    target_s: float
    targets: str


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
    step_cost: StepCostReport | None = None  # None: a worker that does not say (older)

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0

    def to_hash(self) -> dict[str, str]:
        """Hash fields; ``step_cost`` as one JSON field (absent when None)."""
        fields = self.model_dump()
        step_cost = fields.pop("step_cost")
        out = {k: str(int(v) if isinstance(v, bool) else v) for k, v in fields.items()}
        return out if step_cost is None else {**out, "step_cost": json.dumps(step_cost)}

    @classmethod
    def from_hash(cls, fields: dict[str, str]) -> WorkerInfo:
        data: dict[str, Any] = dict(fields)
        if "draining" in data:
            data["draining"] = data["draining"] in ("1", "True", "true")
        if "step_cost" in data:
            data["step_cost"] = json.loads(data["step_cost"])
        return cls.model_validate(data)


@dataclass(frozen=True)
class BandQueue:
    """One band's jobs stream as the workers' group sees it."""

    depth: int  # entries not yet delivered (the group's lag; the stream's length when unknown)
    last_delivered: str | None  # the group's last-delivered id; None: no group yet


def ask_queues(pipe: Any, keys: Keys) -> None:
    """Every band's group info and length, most urgent first (run the pipeline with
    ``raise_on_error=False``: a band without a stream answers XINFO GROUPS with an error)."""
    for stream in keys.job_streams:
        pipe.xinfo_groups(stream)
        pipe.xlen(stream)


def read_queues(replies: Sequence[Any], keys: Keys) -> dict[str, BandQueue]:
    """``ask_queues``' replies: each band's entries not yet delivered to any worker.

    The consumer group's ``lag`` (Redis 7); where it is unknown (no group yet, or Redis 6), the
    stream's length, which also counts delivered, unfinished jobs.
    """
    return {
        band: _band_queue(replies[2 * i], replies[2 * i + 1], keys.group)
        for i, band in enumerate(BANDS)
    }


def _band_queue(groups: Any, length: Any, group: str) -> BandQueue:
    mine = [] if isinstance(groups, Exception) else [g for g in groups if g.get("name") == group]
    lag = mine[0].get("lag") if mine else None
    last = str(mine[0]["last-delivered-id"]) if mine else None
    if lag is not None:
        return BandQueue(int(lag), last)
    return BandQueue(0 if isinstance(length, Exception) else int(length), last)


def live_workers_flow(keys: Keys, now_s: float | None = None) -> Flow[list[WorkerInfo]]:
    """Workers whose heartbeat is younger than ``HEARTBEAT_TTL_S``, by name: two round trips."""
    now_s = time.time() if now_s is None else now_s
    names: Any = yield Command("zrangebyscore", (keys.workers, now_s - HEARTBEAT_TTL_S, "+inf"))
    hashes = yield Pipeline(lambda pipe: [pipe.hgetall(keys.worker(n)) for n in names])
    found = [WorkerInfo.from_hash(h) for h in hashes if h]  # {}: its hash expired meanwhile
    return sorted(found, key=lambda w: w.name)


def queue_depths_flow(keys: Keys) -> Flow[dict[str, int]]:
    """Entries in each band's jobs stream not yet delivered to any worker, most urgent first
    (``read_queues``): one round trip."""
    replies = yield Pipeline(lambda pipe: ask_queues(pipe, keys), raise_on_error=False)
    return {band: queue.depth for band, queue in read_queues(replies, keys).items()}


def live_workers(client: redis.Redis, keys: Keys, now_s: float | None = None) -> list[WorkerInfo]:
    """``live_workers_flow`` on a redis-py client."""
    return drive(live_workers_flow(keys, now_s), IO(client))


def queue_depths(client: redis.Redis, keys: Keys) -> dict[str, int]:
    """``queue_depths_flow`` on a redis-py client."""
    return drive(queue_depths_flow(keys), IO(client))
