"""``paternoster limits show|set|clear``: the admission limits (``producer.admission``).

    paternoster limits set --band interactive --jobs 100 --tokens 50000
    paternoster limits set --tenant-default --jobs 20
    paternoster limits set --tenant acme --tokens 200000
    paternoster limits show [--json]
    paternoster limits clear [--band B | --tenant NAME | --tenant-default]   (none: every limit)

``show`` lists every band, the tenant default and each tenant that has a limit, with what each
has queued now (the default has no queue of its own).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from producer import admission
from producer.admission import Cap
from producer.client import Producer
from producer.keys import BANDS

Command = Callable[[argparse.Namespace], int]


def add_limits_command(
    sub: Any, common: argparse.ArgumentParser, guard: Callable[[Command], Command]
) -> None:
    """Register ``limits`` and its three subcommands; ``guard`` turns errors into exit codes."""
    limits = sub.add_parser("limits", help="show or change the admission limits")
    actions = limits.add_subparsers(dest="limits_command", required=True)

    show = actions.add_parser("show", parents=[common], help="every limit and what is queued")
    show.set_defaults(func=guard(cmd_show))

    change = actions.add_parser("set", parents=[common], help="set one scope's limits")
    _scope_arguments(change, required=True)
    change.add_argument("--jobs", type=_count, default=None, help="queued jobs at most")
    change.add_argument("--tokens", type=_count, default=None, help="queued tokens at most")
    change.set_defaults(func=guard(cmd_set))

    clear = actions.add_parser("clear", parents=[common], help="remove limits (default: all)")
    _scope_arguments(clear, required=False)
    clear.set_defaults(func=guard(cmd_clear))


def _scope_arguments(parser: argparse.ArgumentParser, required: bool) -> None:
    scope = parser.add_mutually_exclusive_group(required=required)
    scope.add_argument("--band", choices=BANDS, help="one priority band's queue")
    scope.add_argument("--tenant", metavar="NAME", help="one tenant, over all bands")
    scope.add_argument(
        "--tenant-default", action="store_true", help="each tenant without limits of its own"
    )


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {value}")
    return value


def _scope(args: argparse.Namespace) -> str | None:
    if args.band:
        return admission.band_scope(args.band)
    if args.tenant:
        return admission.tenant_scope(args.tenant)
    return admission.tenant_scope(None) if args.tenant_default else None


def _producer(args: argparse.Namespace) -> Producer:
    return Producer(args.redis_url, prefix=args.prefix)


def cmd_set(args: argparse.Namespace) -> int:
    if args.jobs is None and args.tokens is None:
        print("paternoster limits set: error: give --jobs, --tokens or both", file=sys.stderr)
        return 2
    scope = _scope(args)
    assert scope is not None  # the scope group is required
    with _producer(args) as producer:
        admission.set_limits(producer.redis, producer.keys, scope, Cap(args.jobs, args.tokens))
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    with _producer(args) as producer:
        admission.clear_limits(producer.redis, producer.keys, _scope(args))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with _producer(args) as producer:
        rows = limit_rows(producer)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'scope':<24} {'jobs queued/limit':>20} {'tokens queued/limit':>22}")
    for row in rows:
        jobs = _pair(row["queued_jobs"], row["max_jobs"])
        tokens = _pair(row["queued_tokens"], row["max_tokens"])
        print(f"{row['scope']:<24} {jobs:>20} {tokens:>22}")
    return 0


def limit_rows(producer: Producer) -> list[dict[str, Any]]:
    """One row per band, the tenant default, and each tenant with limits: scope, its limits
    (None: unlimited) and what it has queued (None for the default)."""
    client, keys = producer.redis, producer.keys
    limits = admission.read_limits(client, keys)
    scopes: list[tuple[str, Cap, str | None]] = [
        (admission.band_scope(b), limits.bands.get(b, Cap()), keys.band_load(b)) for b in BANDS
    ]
    scopes.append((admission.tenant_scope(None), limits.tenant_default, None))
    for tenant, cap in sorted(limits.tenants.items()):
        scopes.append((admission.tenant_scope(tenant), cap, keys.tenant_load(tenant)))
    rows = []
    for scope, cap, load_key in scopes:
        load = admission.read_load(client, load_key) if load_key else Cap()
        rows.append(
            {
                "scope": scope,
                "max_jobs": cap.jobs,
                "max_tokens": cap.tokens,
                "queued_jobs": load.jobs,
                "queued_tokens": load.tokens,
            }
        )
    return rows


def _pair(queued: int | None, limit: int | None) -> str:
    return f"{'-' if queued is None else queued}/{'-' if limit is None else limit}"
