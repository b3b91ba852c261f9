"""How far behind webhook delivery is, read as one flow (``producer.calls``) so the sync readers
(``paternoster webhooks stats``, ``paternoster status``, ``paternoster top``) and the gateway's
``/v1/status`` on its asyncio client run the same reads."""

from __future__ import annotations

from typing import Any

import redis
from pydantic import BaseModel, Field

from producer.calls import IO, Flow, Pipeline, drive
from producer.keys import Keys


class WebhookCounts(BaseModel):
    to_deliver: int = Field(description="deliveries in the stream: queued or in hand")
    in_hand: int = Field(description="pending under a deliverer (sending or waiting to retry)")
    dead: int = Field(description="dead letters kept (about the newest 10,000)")


def _ask(pipe: Any, keys: Keys) -> None:
    pipe.xlen(keys.webhooks)
    pipe.xlen(keys.webhook_dead)
    pipe.xinfo_groups(keys.webhooks)  # an error before the first webhook: no stream yet


def webhook_counts_flow(keys: Keys) -> Flow[WebhookCounts]:
    """The three counts in one round trip."""
    queued, dead, groups = yield Pipeline(lambda pipe: _ask(pipe, keys), raise_on_error=False)
    pending = 0
    if not isinstance(groups, Exception):
        group: dict[str, Any] = next((g for g in groups if g["name"] == keys.webhook_group), {})
        pending = int(group.get("pending", 0))
    return WebhookCounts(to_deliver=int(queued), in_hand=pending, dead=int(dead))


def webhook_counts(client: redis.Redis, keys: Keys) -> WebhookCounts:
    """``webhook_counts_flow`` on a redis-py client."""
    return drive(webhook_counts_flow(keys), IO(client))


def describe(counts: WebhookCounts) -> str:
    """One line for a terminal, as ``paternoster status`` and ``top`` print it."""
    c = counts
    return f"webhooks: {c.to_deliver} to deliver ({c.in_hand} in hand), {c.dead} dead"
