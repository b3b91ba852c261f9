"""The Batch API under load: a batch of 1,000 lines through the gateway and two workers, one of
them killed -9 mid-batch, and interactive requests' TTFT during the batch against idle.

    python ops/bench/batch_api.py --out ops/bench/results/batch_api.json   # tiny model, ~2 min
    python ops/bench/batch_api.py --lines 100 --probes 20                  # smoke

A redis-server of its own, a gateway (``paternoster gateway``, its batch runner inside) and
``--workers`` worker processes on a random-weight model of the ``tiny`` shape (SmolLM2's
tokenizer; ``--model`` for another). Then, with the official ``openai`` client:

1. idle: ``--probes`` streamed completions one after another, TTFT each (first text chunk);
2. a batch of ``--lines`` greedy completions is uploaded and started; while it runs the same
   probes go on, and once ``--kill-at`` of its lines are done one worker gets SIGKILL;
3. at ``completed``: the output file must hold exactly one line per custom_id, none twice,
   none missing, and ``--check`` of them must equal the same request sent one by one.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import openai
import redis
import torch

from gateway.config import GatewayConfig
from ops.bench.batch_api_probes import Probes, split_report, ttft_report
from ops.bench.batch_api_trace import trace_report
from ops.bench.chaos import audit as chaos_audit
from ops.bench.chaos import start_worker
from ops.bench.common import write_report
from ops.bench.random_model import write_random_model
from ops.bench.redis_server import RedisServer, free_port
from producer import Producer
from producer.keys import Keys

PREFIX = "bench-batch"


def start_gateway(
    url: str, port: int, log_dir: Path, args: argparse.Namespace
) -> subprocess.Popen[bytes]:
    """The gateway in a process of its own; inline rather than ``paternoster gateway`` so the
    bench can set ``GatewayConfig``'s batch window, share and poll, which have no flags."""
    code = (
        "import sys, uvicorn; from gateway.app import create_app; "
        "from gateway.config import GatewayConfig; "
        "config = GatewayConfig(redis_url=sys.argv[1], prefix=sys.argv[2], "
        "batch_window=int(sys.argv[4]), batch_poll_s=float(sys.argv[5]), "
        "batch_slot_share=float(sys.argv[6])); "
        "uvicorn.run(create_app(config), port=int(sys.argv[3]), log_level='warning')"
    )
    settings = (args.batch_window, args.batch_poll_s, args.batch_slot_share)
    cmd = [sys.executable, "-c", code, url, PREFIX, str(port), *map(str, settings)]
    log = open(log_dir / "gateway.log", "wb")  # the child keeps it open
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def line(i: int, max_tokens: int) -> dict[str, Any]:
    body = {"model": "m", "prompt": f"Item {i} of the list:", "max_tokens": max_tokens,
            "temperature": 0}  # fmt: skip
    return {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions", "body": body}


def cpu_seconds(pid: int) -> float:
    """A live process's user + system CPU seconds (Linux ``/proc``); 0.0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def wait_ready(client: openai.OpenAI, timeout_s: float = 600.0) -> None:
    """Until the gateway answers and a worker serves (the first request warms the engines; a
    worker that finds the CPU kernels' sources changed builds them first, minutes on 2 cores)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.completions.create(model="m", prompt="warm", max_tokens=2, timeout=30)
            return
        except openai.APIConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def holder(url: str) -> Callable[[str], bool]:
    """Whether a worker holds batch jobs now (pending entries of the batch band's stream):
    the kill waits for one, so it lands mid-work, not between two windows of the batch."""
    client = redis.Redis.from_url(url, decode_responses=True)
    keys = Keys(PREFIX)

    def holds_jobs(name: str) -> bool:
        pending = client.xpending_range(keys.band("batch"), keys.group, "-", "+", 1, name)
        return bool(pending)

    return holds_jobs


def run_batch(
    probes: Probes, args: argparse.Namespace, victim: subprocess.Popen[bytes], url: str
) -> dict[str, Any]:
    """Start the batch, probe TTFT while it runs, kill the victim (worker w0) at ``--kill-at``
    once it holds batch jobs."""
    holds_jobs, victim_name = holder(url), "w0"
    client = probes.openai
    rows = [line(i, args.max_tokens) for i in range(args.lines)]
    data = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
    uploaded = client.files.create(file=("bench.jsonl", io.BytesIO(data)), purpose="batch")
    start = time.perf_counter()
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions",
                                  completion_window="24h")  # fmt: skip
    busy: list[tuple[str, float, float]] = []  # kind, sent (s after the start), TTFT (s)
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            kind = Probes.KINDS[len(busy) % 2]
            sent = time.perf_counter() - start
            busy.append((kind, sent, probes.ttft_s(kind)))

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    killed_at = None
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
        done = batch.request_counts.completed if batch.request_counts else 0
        if killed_at is None and done >= args.kill_at * args.lines and holds_jobs(victim_name):
            victim.send_signal(signal.SIGKILL)
            killed_at = {"completed": done, "t_s": time.perf_counter() - start}
        if time.perf_counter() - start > args.timeout_s:
            raise TimeoutError(f"batch still {batch.status} after {args.timeout_s} s")
    wall_s = time.perf_counter() - start
    stop.set()
    prober.join(timeout=30)
    return {"batch": batch, "wall_s": wall_s, "busy": busy, "killed_at": killed_at, "rows": rows}


def audit(client: openai.OpenAI, ran: dict[str, Any], check: int) -> dict[str, Any]:
    """One output line per custom_id, and greedy parity with one-by-one requests."""
    batch, rows = ran["batch"], ran["rows"]
    text = client.files.content(batch.output_file_id).text if batch.output_file_id else ""
    out = [json.loads(r) for r in text.splitlines()]
    ids = [r["custom_id"] for r in out]
    errors = client.files.content(batch.error_file_id).text if batch.error_file_id else ""
    by_id = {r["custom_id"]: r for r in out}
    mismatches = 0
    step = max(1, len(rows) // max(1, check))
    for row in rows[::step][:check]:
        one = client.completions.create(**row["body"])
        got = by_id.get(row["custom_id"], {}).get("response", {}).get("body", {})
        mismatches += got.get("choices", [{}])[0].get("text") != one.choices[0].text
    expected = {r["custom_id"] for r in rows}
    return {"status": batch.status, "output_lines": len(out), "unique": len(set(ids)),
            "twice": len(ids) - len(set(ids)), "missing": len(expected - set(ids)),
            "error_lines": len(errors.splitlines()), "error_samples": errors.splitlines()[:3],
            "checked": min(check, len(rows)),
            "mismatches": mismatches}  # fmt: skip


def audit_jobs(url: str, batch_id: str, lines: int) -> dict[str, int]:
    """Each line's job as the chaos bench audits it (``chaos.audit``): one terminal event
    each, and how many were recovered from the killed worker (delivered twice)."""
    with Producer(url, prefix=PREFIX) as p:
        ids = [f"{batch_id}-{i}" for i in range(lines)]
        audits = [chaos_audit(p, job_id) for job_id in ids]
        finished_by = Counter(str(p.redis.hget(p.keys.job(job_id), "worker")) for job_id in ids)
    return {"jobs_one_terminal": sum(a["terminal"] == 1 for a in audits),
            "jobs_recovered": sum(a["deliveries"] > 1 for a in audits),
            "jobs_started_twice": sum(a["started"] > 1 for a in audits),
            "jobs_gaps_or_repeats": sum(a["gaps"] + a["repeats"] > 0 for a in audits),
            "jobs_finished_by": dict(finished_by)}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    args.log_dir = str(work)
    server = RedisServer(work)
    server.start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if args.model is None:
            from worker.models.loader import resolve_model_dir

            tiny = write_random_model("tiny", resolve_model_dir(None), work / "tiny",
                                      torch.float32, "cpu")  # fmt: skip
            args.model = str(tiny)
        extra = [*args.worker_arg, *(["--log-level", "info"] if args.trace else [])]
        workers = [start_worker(args, server.url, PREFIX, f"w{i}", extra)
                   for i in range(args.workers)]  # fmt: skip
        port = free_port()
        procs += [
            *workers,
            start_gateway(server.url, port, work, args),
        ]
        probes = Probes(f"http://127.0.0.1:{port}")
        wait_ready(probes.openai)
        idle = [(k, 0.0, probes.ttft_s(k)) for _ in range(args.probes) for k in Probes.KINDS]
        load_before = os.getloadavg()  # the machine is shared: say how busy it was
        probes.phase = "during_batch"
        names = {**{f"w{i}": w.pid for i, w in enumerate(workers)}, "gateway": procs[-1].pid,
                 "bench": os.getpid(), "redis": server.proc.pid if server.proc else 0}  # fmt: skip
        cpu_before = {name: cpu_seconds(pid) for name, pid in names.items()}
        ran = run_batch(probes, args, workers[0], server.url)
        cpu_after = {name: cpu_seconds(pid) for name, pid in names.items()}
        report = {"lines": args.lines, "workers": args.workers, "max_tokens": args.max_tokens,
                  "batch_window": args.batch_window, "batch_poll_s": args.batch_poll_s,
                  "batch_slot_share": args.batch_slot_share, "worker_args": extra,
                  "model": args.model, "wall_s": ran["wall_s"],
                  "lines_per_s": args.lines / ran["wall_s"], "killed_at": ran["killed_at"],
                  **audit(probes.openai, ran, args.check),
                  **audit_jobs(server.url, ran["batch"].id, args.lines)}  # fmt: skip
        kill_s = ran["killed_at"]["t_s"] if ran["killed_at"] else math.inf
        report["ttft"] = ttft_report(idle, ran["busy"], kill_s)
        report["native_ttft_split"] = split_report(probes)
        if args.trace:
            report["trace"] = trace_report(probes, server.url, PREFIX, work)
        report["loadavg_1m"] = {"before": load_before[0], "after": os.getloadavg()[0]}
        # Where the 2 cores went while the batch ran: CPU seconds per process over its wall time
        # (a worker killed mid-batch reads 0 after: null).
        report["cpu_share_during_batch"] = {
            name: round((cpu_after[name] - cpu_before[name]) / ran["wall_s"], 3)
            if cpu_after[name] and cpu_before[name]
            else None
            for name in names
        }
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)
        server.stop()
    print(json.dumps(report, indent=2))
    write_report(report, args.out)
    return report


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="HF directory; default a random model of the tiny shape")
    ap.add_argument("--lines", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument(
        "--kill-at", type=float, default=0.3, help="fraction done at the kill (> 1: no kill)"
    )
    ap.add_argument("--probes", type=int, default=100, help="idle TTFT probes of each kind")
    ap.add_argument("--check", type=int, default=50, help="lines compared one by one")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--batch-window", type=int, default=GatewayConfig.batch_window)
    ap.add_argument("--batch-poll-s", type=float, default=GatewayConfig.batch_poll_s)
    ap.add_argument("--batch-slot-share", type=float, default=GatewayConfig.batch_slot_share)
    ap.add_argument("--step-delay-s", type=float, default=0.0)
    ap.add_argument("--worker-arg", action="append", default=[], metavar="FLAG",
                    help="a worker flag, repeated: --worker-arg=--threads=2")  # fmt: skip
    ap.add_argument("--trace", action="store_true",
                    help="split each probe's TTFT (workers log at info)")  # fmt: skip
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--out", type=Path)
    return ap.parse_args(argv)


if __name__ == "__main__":
    main()
