"""What Redis keeps of each delivery: its fields in the job's delivery hash, and the dead letter.

``Keys.delivery(job_id)`` holds ``<event>_<field>`` for each event delivered (``terminal``,
``started``): attempts, first/last attempt and next attempt times, last status code and error,
``delivered_at`` and the outcome. A deliverer that takes a delivery over reads them, so the
attempt count and backoff schedule survive it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import redis.asyncio as aredis

from producer.keys import DEAD_LETTER_MAXLEN, Keys


class Outcome(enum.StrEnum):
    PENDING = "pending"  # attempted, to be retried
    DELIVERED = "delivered"  # a 2xx answer
    DEAD_LETTER = "dead_letter"  # given up: see last_error


@dataclass(frozen=True)
class Record:
    """One delivery's state; times are unix seconds (0: not yet)."""

    delivery_id: str
    url: str = ""
    attempts: int = 0
    first_attempt_at: float = 0.0
    last_attempt_at: float = 0.0
    next_attempt_at: float = 0.0
    last_status: int = 0  # the last HTTP status; 0: none (timeout, connection error, refused)
    last_error: str = ""
    delivered_at: float = 0.0
    outcome: str = Outcome.PENDING.value

    def to_hash(self, event: str) -> dict[str, str | int | float]:
        return {f"{event}_{name}": value for name, value in asdict(self).items()}

    @classmethod
    def from_hash(cls, event: str, fields: Mapping[str, str], delivery_id: str) -> Record:
        """The record of ``delivery_id``; a fresh one when the hash holds another delivery's
        (the same job id submitted again after its first life expired) or none."""
        head = f"{event}_"
        mine = {k.removeprefix(head): v for k, v in fields.items() if k.startswith(head)}
        if mine.get("delivery_id") != delivery_id:
            return cls(delivery_id)
        fresh = asdict(cls(delivery_id))
        # Each field back to its default's type: int, float or str.
        values: dict[str, Any] = {k: type(fresh[k])(v) for k, v in mine.items() if k in fresh}
        return replace(cls(delivery_id), **values)


async def load(client: aredis.Redis, keys: Keys, job_id: str, event: str, did: str) -> Record:
    fields: dict[str, str] = await client.hgetall(keys.delivery(job_id))  # type: ignore[assignment]
    return Record.from_hash(event, fields, did)


async def save(
    client: aredis.Redis, keys: Keys, job_id: str, event: str, record: Record, ttl_s: int
) -> None:
    pipe = client.pipeline(transaction=True)
    pipe.hset(keys.delivery(job_id), mapping=record.to_hash(event))  # type: ignore[arg-type]
    pipe.expire(keys.delivery(job_id), ttl_s)
    await pipe.execute()


@dataclass(frozen=True)
class Entry:
    """A webhooks-stream entry in hand: where it is and what it says."""

    entry_id: str
    job_id: str
    event: str
    submitted_at: str

    @property
    def delivery_id(self) -> str:
        """Stable over retries and deliverers: receivers deduplicate by it (``webhook-id``).
        The submit time tells apart a job id submitted again after its first life expired."""
        return f"{self.job_id}:{self.event}:{self.submitted_at}"


async def finish(
    client: aredis.Redis, keys: Keys, entry: Entry, record: Record, ttl_s: int, reason: str = ""
) -> None:
    """The delivery's end, in one MULTI: its record, a dead letter when ``reason`` says why,
    then the entry acknowledged and deleted (the stream holds only deliveries still to make)."""
    pipe = client.pipeline(transaction=True)
    pipe.hset(keys.delivery(entry.job_id), mapping=record.to_hash(entry.event))  # type: ignore[arg-type]
    pipe.expire(keys.delivery(entry.job_id), ttl_s)
    if reason:
        dead = {
            "id": entry.job_id,
            "event": entry.event,
            "delivery_id": entry.delivery_id,
            "url": record.url,
            "attempts": record.attempts,
            "last_status": record.last_status,
            "reason": reason,
        }
        pipe.xadd(keys.webhook_dead, dead, maxlen=DEAD_LETTER_MAXLEN, approximate=True)  # type: ignore[arg-type]
    pipe.xack(keys.webhooks, keys.webhook_group, entry.entry_id)
    pipe.xdel(keys.webhooks, entry.entry_id)
    await pipe.execute()
