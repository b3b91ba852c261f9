"""``paternoster status``: one job's status fields, or, with no job id, the deployment's counts.

    paternoster status JOB_ID [--json]   # the job's status hash, times as ISO 8601
    paternoster status [--json]          # queued entries per band and webhook deliveries behind

The deployment form reads what ``/v1/status`` shows of queues and webhooks (``producer.fleet``,
``producer.webhook_stats``): two round trips, no worker HTTP.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from producer.client import Producer
from producer.fleet import queue_depths
from producer.webhook_stats import describe, webhook_counts

Command = Callable[[argparse.Namespace], int]


def add_status_command(
    sub: Any, common: argparse.ArgumentParser, guard: Callable[[Command], Command]
) -> None:
    """Register ``status``; ``guard`` turns Redis and input errors into exit codes."""
    status = sub.add_parser(
        "status", parents=[common], help="print a job's status fields (no ID: queues and webhooks)"
    )
    status.add_argument("job_id", metavar="ID", nargs="?", default=None)
    status.set_defaults(func=guard(cmd_status))


def cmd_status(args: argparse.Namespace) -> int:
    if args.job_id is None:
        return _deployment(args)
    with Producer(args.redis_url, prefix=args.prefix) as producer:
        status = producer.status(args.job_id)
    if args.json:
        print(_json(status.model_dump(mode="json")))
        return 0
    fields = {k: v for k, v in status.model_dump().items() if v is not None}
    width = max(len(k) for k in fields) + 1
    for name, value in fields.items():
        shown = _iso_time(value) if name.endswith("_at") else str(value)
        print(f"{name + ':':<{width}} {shown}")
    return 0


def _deployment(args: argparse.Namespace) -> int:
    with Producer(args.redis_url, prefix=args.prefix) as producer:
        depths = queue_depths(producer.redis, producer.keys)
        hooks = webhook_counts(producer.redis, producer.keys)
    if args.json:
        print(_json({"queues": depths, "webhooks": hooks.model_dump()}))
        return 0
    bands = ", ".join(f"{band} {n}" for band, n in depths.items())
    print(f"queued: {bands}; total {sum(depths.values())}")
    print(describe(hooks))
    return 0


def _iso_time(unix_s: Any) -> str:
    return datetime.fromtimestamp(float(unix_s), UTC).isoformat(timespec="milliseconds")


def _json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)
