"""A job's webhook: where and how the job's end is delivered (``JobSpec.webhook``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from producer.wire import Frozen

# The events a webhook may ask for; terminal (the job ended: done, error, cancelled, expired)
# is the default, `started` is opt-in.
WebhookEvent = Literal["terminal", "started"]


class WebhookSpec(Frozen):
    url: str = Field(min_length=1, max_length=2048)
    # Per-job signing secret; None: the deliverer's server-side default secret signs.
    secret: str | None = Field(default=None, min_length=1, max_length=256)
    events: tuple[WebhookEvent, ...] = ("terminal",)
