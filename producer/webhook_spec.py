"""A job's webhook: where and how the job's end is delivered (``JobSpec.webhook``).

Validated wherever a JobSpec is (the producer before it enqueues, the worker again when it
takes the job, the deliverer before it connects), so a URL the address policy refuses
(``producer.webhook_policy``) is an ``invalid job`` naming ``webhook.url`` at submit.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, field_validator

from producer.webhook_policy import check_url
from producer.wire import Frozen

# The events a webhook may ask for; terminal (the job ended: done, error, cancelled, expired)
# is the default, `started` is opt-in.
WebhookEvent = Literal["terminal", "started"]
WEBHOOK_EVENTS: tuple[str, ...] = get_args(WebhookEvent)


class WebhookSpec(Frozen):
    url: str = Field(min_length=1, max_length=2048)
    # Per-job signing secret; None: the deliverer's server-side default secret signs.
    secret: str | None = Field(default=None, min_length=1, max_length=256)
    events: tuple[WebhookEvent, ...] = Field(default=("terminal",), min_length=1)

    @field_validator("url")
    @classmethod
    def _callable_url(cls, url: str) -> str:
        check_url(url)  # WebhookRefused is a ValueError: pydantic names the field
        return url

    @field_validator("events")
    @classmethod
    def _distinct(cls, events: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(events)) != len(events):
            raise ValueError(f"events must not repeat: {list(events)}")
        return events

    def wants(self, event: str) -> bool:
        return event in self.events
