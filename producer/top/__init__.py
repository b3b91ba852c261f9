"""``paternoster top``: a live view of a deployment, from Redis alone (no worker HTTP).

    paternoster top                      # redraw every second until Ctrl-C
    paternoster top --interval-s 5
    paternoster top --once               # one frame, for scripts
    paternoster top --once --json        # the same frame as one JSON object

Three parts: ``snapshot.build_snapshot`` reads Redis into a frozen ``Snapshot``;
``render.render`` draws one as text for a terminal's width and height; ``run_loop`` repeats the
two, passing each frame to the next so worker tokens/s come from the change between them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import redis

from producer.client import Producer
from producer.keys import Keys
from producer.top.render import render
from producer.top.snapshot import Latency, Snapshot, WorkerRow, build_snapshot

__all__ = ["Latency", "Snapshot", "WorkerRow", "add_top_command", "build_snapshot", "render"]

Command = Callable[[argparse.Namespace], int]
# Cursor home, then each line clears its own rest and the frame clears below itself: redrawing
# over the last frame instead of blanking the screen first, so a 1 s refresh does not flicker.
HOME, CLEAR_LINE, CLEAR_BELOW = "\x1b[H", "\x1b[K", "\x1b[J"


def add_top_command(
    sub: Any, common: argparse.ArgumentParser, guard: Callable[[Command], Command]
) -> None:
    """Register ``top``; ``guard`` turns Redis and input errors into exit codes."""
    top = sub.add_parser(
        "top", parents=[common], help="live view of queues, workers and recent jobs"
    )
    top.add_argument(
        "--interval-s", type=_positive, default=1.0, help="seconds between frames (default 1)"
    )
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.set_defaults(func=guard(cmd_top))


def cmd_top(args: argparse.Namespace) -> int:
    if args.json and not args.once:
        print("paternoster top: error: --json needs --once", file=sys.stderr)
        return 2
    with Producer(args.redis_url, prefix=args.prefix) as producer:
        if not args.once:
            return run_loop(producer.redis, producer.keys, args.interval_s)
        snap = build_snapshot(producer.redis, producer.keys)
    if args.json:
        print(json.dumps(snap.to_json(), ensure_ascii=False))
    else:
        print(render(snap, width=shutil.get_terminal_size().columns))
    return 0


def run_loop(
    client: redis.Redis,
    keys: Keys,
    interval_s: float,
    out: TextIO | None = None,
    frames: int | None = None,
) -> int:
    """Draw a frame every ``interval_s`` until Ctrl-C (or ``frames`` frames, for tests). A lost
    Redis connection shows as one line and the loop keeps trying: a restarting Redis should
    not end the view of it."""
    out = out or sys.stdout
    previous: Snapshot | None = None
    drawn = 0
    try:
        while frames is None or drawn < frames:
            if drawn:
                time.sleep(interval_s)
            size = shutil.get_terminal_size()
            try:
                previous = build_snapshot(client, keys, previous)
                frame = render(previous, size.columns, size.lines - 1, interval_s)
            except (redis.ConnectionError, redis.TimeoutError) as err:
                frame = f"paternoster top: cannot reach Redis: {err}; retrying"
            lines = frame.split("\n")
            out.write(HOME + "".join(line + CLEAR_LINE + "\n" for line in lines) + CLEAR_BELOW)
            out.flush()
            drawn += 1
    except KeyboardInterrupt:
        out.write("\n")
    return 0


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return value
