"""``paternoster submit``'s webhook flags: ``--webhook-url URL [--webhook-secret S]
[--webhook-event EVENT ...]``, which become the job's ``WebhookSpec`` (docs/webhooks.md).

The URL is checked where every webhook is (``producer.webhook_policy``, when the job is built):
a refused address is ``invalid job: webhook.url: ...`` and exit 2, nothing enqueued.
"""

from __future__ import annotations

import argparse
from typing import Any

from producer.errors import InvalidJob
from producer.webhook_spec import WEBHOOK_EVENTS, WebhookSpec


def add_webhook_arguments(parser: argparse.ArgumentParser) -> None:
    """The webhook flags of ``submit``."""
    g = parser.add_argument_group("webhook")
    g.add_argument("--webhook-url", metavar="URL", help="POST the job's end here, signed")
    g.add_argument(
        "--webhook-secret",
        metavar="S",
        help="sign with S (whsec_<base64> or any string); default: the deliverer's "
        "PATERNOSTER_WEBHOOK_SECRET",
    )
    default_events = WebhookSpec.model_fields["events"].default
    g.add_argument(
        "--webhook-event",
        dest="webhook_events",
        action="append",
        choices=WEBHOOK_EVENTS,
        metavar="EVENT",
        help=f"deliver on EVENT ({', '.join(WEBHOOK_EVENTS)}); repeat for several "
        f"(default: {', '.join(default_events)})",
    )


def webhook_fields(args: argparse.Namespace) -> dict[str, Any] | None:
    """The webhook the flags ask for (None: no --webhook-url); InvalidJob when a secret or an
    event is given without a URL, which would otherwise be silently dropped."""
    if args.webhook_url is None:
        if args.webhook_secret is not None or args.webhook_events:
            raise InvalidJob(
                "invalid job: webhook: --webhook-secret and --webhook-event need --webhook-url"
            )
        return None
    fields: dict[str, Any] = {"url": args.webhook_url, "secret": args.webhook_secret}
    if args.webhook_events:
        fields["events"] = args.webhook_events
    return fields
