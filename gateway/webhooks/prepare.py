"""What a delivery needs before its first attempt: the webhook, checked again, its secret and
the body. Anything wrong here is a ``Refusal``: dead-lettered at once, nothing sent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aredis
from pydantic import ValidationError

from gateway.webhooks import payload, signing
from gateway.webhooks.records import Entry
from producer import envs
from producer.keys import Keys
from producer.status import StatusField
from producer.webhook_spec import WebhookSpec


class Refusal(Exception):
    """The delivery cannot be made: the message says why (the dead letter's reason)."""


@dataclass(frozen=True)
class Prepared:
    url: str
    secret: str
    body: bytes


# The reason of a delivery whose job outlived its result: the deliverers were behind for longer
# than the worker's --result-ttl-s (a day by default), or took it over after that.
GONE = "the job's status hash is gone: its result TTL passed before the delivery was made"
RESUBMITTED = (
    "the job's result TTL passed before the delivery was made, and its id was submitted again"
)


def _check_life(entry: Entry, submitted: str | None) -> None:
    """Refusal unless the job's status hash (its ``submitted_at``; None: gone) is still of the
    life the entry was enqueued for."""
    if submitted is None:
        raise Refusal(GONE)
    if entry.submitted_at and submitted != entry.submitted_at:  # the delivery id's own time
        raise Refusal(f"{RESUBMITTED} (submitted at {entry.submitted_at}, now {submitted})")


async def check_current(client: aredis.Redis, keys: Keys, entry: Entry) -> None:
    """Before a retry: the job's result is still there (one HGET), so whichever deliverer holds
    the delivery, one past the result TTL ends the same way."""
    job = keys.job(entry.job_id)
    submitted: str | None = await client.hget(job, StatusField.SUBMITTED_AT)  # type: ignore[assignment]
    _check_life(entry, submitted)


def _spec(raw: str | None) -> WebhookSpec:
    if raw is None:
        raise Refusal("the job's status hash holds no webhook (not submitted through SUBMIT)")
    try:
        return WebhookSpec.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "webhook"
        raise Refusal(f"invalid webhook: {where}: {first['msg']}") from None


async def prepare(
    client: aredis.Redis, keys: Keys, entry: Entry, default_secret: str | None
) -> Prepared:
    """The delivery's URL, secret and body; Refusal when one of them cannot be had."""
    status: dict[str, str] = await client.hgetall(keys.job(entry.job_id))  # type: ignore[assignment]
    _check_life(entry, status.get(StatusField.SUBMITTED_AT, "") if status else None)
    spec = _spec(status.get(StatusField.WEBHOOK))
    if not spec.wants(entry.event):
        raise Refusal(f"the webhook does not ask for {entry.event!r} events")
    secret = spec.secret or default_secret
    if secret is None:
        raise Refusal(f"no secret: the webhook has none and {envs.WEBHOOK_SECRET_ENV} is unset")
    try:
        signing.secret_key(secret)
    except signing.InvalidSecret as exc:
        raise Refusal(str(exc)) from None
    entries: Any = await client.xrange(keys.events(entry.job_id))
    try:
        body = payload.body(entry.job_id, entry.event, status, entries)
    except payload.JobGone as exc:
        raise Refusal(str(exc)) from None
    return Prepared(spec.url, secret, body)
