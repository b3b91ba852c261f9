"""``paternoster webhooks``: run a deliverer, or look at deliveries (``dead``, ``show``,
``stats``) and make a signing secret (``secret``). Light at import: httpx and prometheus_client
load only when a deliverer runs."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from typing import Any

from gateway.webhooks.config import WebhookConfig


def add_webhooks_command(sub: Any) -> None:
    """Register ``webhooks`` (and its inspection subcommands) on ``paternoster``'s subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--redis-url", default=None, help="default: REDIS_URL, else embedded")
    common.add_argument("--prefix", default=None, help="default: PATERNOSTER_PREFIX")
    wh: argparse.ArgumentParser = sub.add_parser(
        "webhooks", parents=[common], help="deliver job webhooks (signed, retried, durable)"
    )
    wh.add_argument("--metrics-port", type=int, default=None, help="serve /metrics and /health")
    wh.add_argument("--metrics-host", default="127.0.0.1")
    wh.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    WebhookConfig.add_arguments(wh)
    wh.set_defaults(func=cmd_run)
    what = wh.add_subparsers(dest="webhooks_command", metavar="{dead,show,stats,secret}")
    dead = what.add_parser("dead", parents=[common], help="the dead letters, newest first")
    dead.add_argument("--count", type=int, default=20)
    dead.set_defaults(func=cmd_dead)
    show = what.add_parser("show", parents=[common], help="one job's delivery records")
    show.add_argument("job_id")
    show.set_defaults(func=cmd_show)
    stats = what.add_parser("stats", parents=[common], help="queued, pending and dead counts")
    stats.set_defaults(func=cmd_stats)
    what.add_parser("secret", help="a new whsec_ signing secret").set_defaults(func=cmd_secret)


def _keys(args: argparse.Namespace) -> Any:
    from producer import envs
    from producer.keys import Keys

    return Keys(args.prefix or envs.key_prefix())


def _redis(args: argparse.Namespace) -> Any:
    import redis

    from producer.connection import resolve_redis_url

    url, _embedded = resolve_redis_url(args.redis_url)
    return redis.Redis.from_url(url, decode_responses=True)


def cmd_run(args: argparse.Namespace) -> int:
    from gateway.webhooks.serve import serve

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(message)s")
    config = WebhookConfig.from_args(args)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve(args.redis_url, _keys(args), config, stop, args.metrics_port, args.metrics_host)

    asyncio.run(main())
    return 0


def _print(obj: object) -> None:
    print(json.dumps(obj, ensure_ascii=False))


def cmd_dead(args: argparse.Namespace) -> int:
    keys, client = _keys(args), _redis(args)
    for entry_id, fields in client.xrevrange(keys.webhook_dead, count=args.count):
        _print({"entry_id": entry_id, **fields})
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    keys, client = _keys(args), _redis(args)
    fields = client.hgetall(keys.delivery(args.job_id))
    if not fields:
        print(f"paternoster webhooks show: no deliveries for {args.job_id}", file=sys.stderr)
        return 2
    _print(fields)
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """Entries to deliver (queued or in hand), those in hand (pending), and dead letters."""
    from producer.webhook_stats import webhook_counts

    counts = webhook_counts(_redis(args), _keys(args))
    _print(counts.model_dump())
    return 0


def cmd_secret(_args: argparse.Namespace) -> int:
    from gateway.webhooks.signing import new_secret

    print(new_secret())
    return 0
