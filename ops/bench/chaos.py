"""Chaos: jobs through workers that get ``kill -9``ed and a Redis that restarts; audit every stream.

    python ops/bench/chaos.py --out ops/bench/results/chaos.json            # 500 jobs, ~5 min
    python ops/bench/chaos.py --jobs 40 --kills 2 --model DIR               # smoke

A redis-server of its own (append-only file, fsync every second) and ``--workers`` worker
processes serve ``--jobs`` short greedy jobs, all submitted at once. While they run, ``--kills``
times a random worker gets SIGKILL (a replacement starts under a new name), and once, halfway,
Redis is restarted (SIGTERM, then started again on the same files). Then every job's result
stream is audited, Jepsen-style:

- lost: no terminal event by the end (``--timeout-s``);
- duplicated: more than one terminal event, or more than one ``started``;
- gaps / repeats: a choice's token indices skip ahead, or go back (a token written twice);
- recovered: finished after a worker holding it died (its status shows a second delivery).

Target: 0 lost, 0 duplicated, 0 gaps, 0 repeats.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import redis

from ops.bench.common import write_report
from ops.bench.redis_server import RedisServer
from producer import Producer
from producer.protocol import StartedEvent, TokenEvent, is_terminal, parse_event


def start_worker(
    args: argparse.Namespace, url: str, prefix: str, name: str, extra: Sequence[str] = ()
) -> subprocess.Popen[bytes]:
    """A worker process; ``extra`` flags go last, so they override the ones set here."""
    cmd = [sys.executable, "-m", "worker.cli", "worker", "--redis-url", url, "--prefix", prefix]
    cmd += ["--name", name, "--threads", "1", "--max-num-seqs", str(args.max_num_seqs)]
    cmd += ["--kv-cache-bytes", str(256 << 20), "--log-level", "warning"]
    if args.model:
        cmd += ["--model", args.model]
    cmd += extra
    env = {**os.environ, "PATERNOSTER_CHAOS": "1"}
    if args.step_delay_s:
        env["PATERNOSTER_CHAOS_STEP_DELAY_S"] = str(args.step_delay_s)
    log = open(Path(args.log_dir) / f"{name}.log", "wb")  # the child keeps it open
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def audit(p: Producer, job_id: str) -> dict[str, Any]:
    entries: Any = p.redis.xrange(p.keys.events(job_id))
    events = [parse_event(eid, fields) for eid, fields in entries]
    next_index: dict[int, int] = {}
    gaps = repeats = 0
    for event in events:
        if isinstance(event, TokenEvent):
            expected = next_index.get(event.choice, 0)
            gaps += event.index > expected
            repeats += event.index < expected
            next_index[event.choice] = max(expected, event.index + len(event.token_ids))
    status: Any = p.redis.hgetall(p.keys.job(job_id))
    return {
        "terminal": sum(is_terminal(e) for e in events),
        "started": sum(isinstance(e, StartedEvent) for e in events),
        "outcome": next((e.type for e in reversed(events) if is_terminal(e)), None),
        "gaps": gaps,
        "repeats": repeats,
        "tokens": sum(next_index.values()),
        "deliveries": int(status.get("deliveries") or 0),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    prefix = f"chaos-{os.getpid()}"
    with tempfile.TemporaryDirectory() as data:
        server = RedisServer(Path(data))
        server.start()
        workers: dict[str, subprocess.Popen[bytes]] = {}
        for i in range(args.workers):
            workers[f"w{i}"] = start_worker(args, server.url, prefix, f"w{i}")
        try:
            return drive(args, rng, server, prefix, workers)
        finally:
            for proc in workers.values():
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            server.stop()


class Faults:
    """The faults of one run: ``--kills`` SIGKILLs at random times over the fault window (each
    victim replaced under a new name) and, with ``--redis-restarts``, a restart midway."""

    def __init__(
        self,
        args: argparse.Namespace,
        rng: random.Random,
        server: RedisServer,
        prefix: str,
        workers: dict[str, subprocess.Popen[bytes]],
    ) -> None:
        self.args, self.rng = args, rng
        self.server, self.prefix, self.workers = server, prefix, workers
        self.kills = sorted(rng.uniform(3, args.fault_window_s) for _ in range(args.kills))
        self.restart_at: float | None = args.fault_window_s / 2 if args.redis_restarts else None
        self.spawned = len(workers)
        self.events: list[dict[str, Any]] = []

    @property
    def pending(self) -> bool:
        return bool(self.kills) or self.restart_at is not None

    def inject(self, now: float) -> None:
        """Every fault due at ``now`` (s from the start)."""
        if self.kills and now >= self.kills[0]:
            self.kills.pop(0)
            self.kill_one(round(now, 2))
        if self.restart_at is not None and now >= self.restart_at:
            self.restart_at = None
            self.server.restart(down_s=1.0)
            self.events.append({"t_s": round(now, 2), "fault": "redis restart"})

    def kill_one(self, t_s: float) -> None:
        live = [n for n, proc in self.workers.items() if proc.poll() is None]
        if not live:  # every worker died on its own: that is a failure the audit shows
            self.events.append({"t_s": t_s, "fault": "no live worker to kill"})
            return
        victim = self.rng.choice(live)
        self.workers[victim].send_signal(signal.SIGKILL)
        name = f"w{self.spawned}"
        self.spawned += 1
        self.workers[name] = start_worker(self.args, self.server.url, self.prefix, name)
        self.events.append({"t_s": t_s, "fault": "kill -9", "worker": victim, "replacement": name})


def drive(
    args: argparse.Namespace,
    rng: random.Random,
    server: RedisServer,
    prefix: str,
    workers: dict[str, subprocess.Popen[bytes]],
) -> dict[str, Any]:
    p = Producer(server.url, prefix=prefix)
    ids = [
        p.submit(
            f"Chaos job {i}: count to ten.",
            max_tokens=args.max_tokens,
            temperature=0.0,
            ignore_eos=True,
        ).job_id
        for i in range(args.jobs)
    ]
    start = time.monotonic()
    faults = Faults(args, rng, server, prefix, workers)
    while time.monotonic() - start < args.timeout_s:
        faults.inject(time.monotonic() - start)
        if not faults.pending and all_ended(p, ids):
            break
        time.sleep(0.25)
    wall = time.monotonic() - start
    audits = [audit(p, job_id) for job_id in ids]
    p.close()
    return {"summary": summarize(audits, wall), "faults": faults.events, "args": vars(args)}


def summarize(audits: Sequence[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """The audit's counts over every job (the docstring says what each means)."""
    return {
        "jobs": len(audits),
        "lost": sum(a["terminal"] == 0 for a in audits),
        "duplicated": sum(a["terminal"] > 1 or a["started"] > 1 for a in audits),
        "gaps": sum(a["gaps"] > 0 for a in audits),
        "repeats": sum(a["repeats"] > 0 for a in audits),
        "recovered": sum(a["deliveries"] > 1 and a["outcome"] == "done" for a in audits),
        "done": sum(a["outcome"] == "done" for a in audits),
        "outcomes": {
            o: sum(a["outcome"] == o for a in audits) for o in {a["outcome"] for a in audits}
        },
        "wall_s": round(wall_s, 1),
    }


def all_ended(p: Producer, ids: Sequence[str]) -> bool:
    try:
        pipe = p.redis.pipeline(transaction=False)
        for job_id in ids:
            pipe.hget(p.keys.job(job_id), "state")
        states = pipe.execute()
    except redis.ConnectionError:
        return False
    return all(s in ("done", "error", "cancelled", "expired") for s in states)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="HF directory or .gguf; default the bundled SmolLM2-135M")
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--redis-restarts", type=int, default=1, choices=[0, 1])
    ap.add_argument("--fault-window-s", type=float, default=60.0)
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--step-delay-s", type=float, default=0.0, help="slow each step (tiny models)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-dir", default=tempfile.gettempdir())
    ap.add_argument("--out", type=Path)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    report = run(args)
    s = report["summary"]
    for fault in report["faults"]:
        print(f"  t={fault['t_s']:>6} s  {fault['fault']} {fault.get('worker', '')}")
    print(
        f"{s['jobs']} jobs in {s['wall_s']} s: lost {s['lost']}, duplicated {s['duplicated']}, "
        f"gaps {s['gaps']}, repeats {s['repeats']}, recovered {s['recovered']}, done {s['done']} "
        f"{s['outcomes']}"
    )
    write_report(report, args.out, default=str)
    return report


if __name__ == "__main__":
    main()
