"""What the scripts need to enqueue webhook deliveries: the delivery entry's fields, the
events, and the Lua definitions, merged into ``scripts.declarations`` and ``definitions``.

Every script that writes a terminal (or ``started``) event calls ``enqueue_webhook`` in the same
atomic step (SUBMIT copies the payload's webhook into the status hash for them); the worker,
whose terminal events go through its publisher's MULTI, runs the WEBHOOK script inside it.
"""

from __future__ import annotations

import enum
from importlib import resources

from producer import lua_prelude
from producer.keys import Keys
from producer.webhook_spec import WEBHOOK_EVENTS, WebhookSpec


class DeliveryField(enum.StrEnum):
    """The fields of a webhooks-stream entry (``Keys.webhooks``)."""

    ID = "id"  # the job id
    EVENT = "event"  # a webhook event: "terminal" or "started"
    SUBMITTED_AT = "submitted_at"  # the job's, from its status hash: part of the delivery id


class Hook(enum.StrEnum):
    """The webhook events (``webhook_spec.WebhookEvent``) as the scripts name them."""

    TERMINAL = "terminal"
    STARTED = "started"


assert tuple(Hook) == WEBHOOK_EVENTS, "Hook must list webhook_spec.WebhookEvent, in order"
_DEFAULT_EVENTS = WebhookSpec.model_fields["events"].default
assert len(_DEFAULT_EVENTS) == 1, _DEFAULT_EVENTS  # the Lua default is one event


def tables() -> dict[str, dict[str, lua_prelude.LuaValue]]:
    return {
        "Delivery": {m.name: m.value for m in DeliveryField},
        "Hook": {m.name: m.value for m in Hook},
        "WebhookSpec": {name.upper(): name for name in WebhookSpec.model_fields},
    }


def values() -> dict[str, lua_prelude.LuaValue]:
    return {"DEFAULT_WEBHOOK_EVENT": str(_DEFAULT_EVENTS[0])}


def definitions() -> dict[str, str]:
    """Key functions generated from ``Keys``, then the shared ``enqueue_webhook`` (it uses
    ``job_key``, which ``scripts.definitions`` defines before these)."""
    lp = lua_prelude
    shared = resources.files("producer").joinpath("lua", "shared", "enqueue_webhook.lua")
    return {
        "webhooks_key": lp.concat_function("webhooks_key", ["prefix"], lambda p: Keys(p).webhooks),
        "dead_letter_key": lp.concat_function(
            "dead_letter_key", ["prefix"], lambda p: Keys(p).dead_letter
        ),
        "enqueue_webhook": shared.read_text(encoding="utf-8").strip(),
    }


def webhook_keys(keys: Keys, job_id: str) -> list[str]:
    """The WEBHOOK script's KEYS: the job's status hash."""
    return [keys.job(job_id)]


def webhook_args(keys: Keys, event: Hook) -> list[str]:
    """The WEBHOOK script's ARGV: the key prefix and the event."""
    return [keys.prefix, event.value]
