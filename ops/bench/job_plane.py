"""What the Redis job plane costs: one workload in-process and through Redis, in one run.

    python ops/bench/job_plane.py --out ops/bench/results/job-plane.json     # 64 jobs, ~5 min
    python ops/bench/job_plane.py --num-requests 8 --scale 0.1               # smoke test

Systems, each on a fresh engine with the same config, one after another in this process
(``--rounds 2`` alternates them twice; the machine is noisy):

- ``engine``: `LLMEngine`, every request added at once, stepped to completion.
- ``redis``: a `JobWorker` (the model loop on the thread that built the engine, plus its
  intake, cancel and publisher threads) on ``REDIS_URL`` or an embedded Redis; a client process
  (``job_client.py``) submits every job at once and follows all result streams with one XREAD
  loop until each has its terminal event. Timed from the first submit to the last terminal
  event read, by the client.

The workload is ``ops/bench/engine.py``'s (random token ids, forced output lengths, greedy).
Both systems must produce the same tokens. Reported: output tok/s, the ratio redis/engine, and
Redis commands per generated token (server side, from INFO commandstats, split by command),
plus the worker's publish round trips per engine step.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import redis
import torch

from ops.bench.common import environment, in_worker_thread, write_report
from ops.bench.engine_workload import (
    BenchRequest,
    make_workload,
    normal_token_ids,
    warmup_prompt,
    workload_totals,
)
from ops.bench.our_engine import StepCounter, add_engine_arguments, engine_config, step_all, warm_up
from producer.connection import resolve_redis_url
from worker.engine.llm_engine import LLMEngine
from worker.models.config import ModelConfig
from worker.models.loader import load_tokenizer, resolve_model_dir
from worker.service.build import build_worker
from worker.service.config import WorkerConfig
from worker.service.worker import JobWorker

Workload = Sequence[BenchRequest]
# Commands the bench itself sends (its counters, its clean-up), not the job plane's.
BENCH_COMMANDS = ("info", "scan", "del")


def make_engine(args: argparse.Namespace) -> LLMEngine:
    # The model as named (None: the bundled GGUF, on its blocks), as our_engine.run_ours does.
    engine = LLMEngine(engine_config(args, args.model))
    warm_up(engine, warmup_prompt(args.token_ids))
    return engine


def run_engine(args: argparse.Namespace, workload: Workload) -> dict[str, Any]:
    engine = make_engine(args)
    counter = StepCounter(engine)
    start = time.perf_counter()
    outputs = step_all(engine, workload)
    return {"wall_s": time.perf_counter() - start, "steps": counter.steps, "outputs": outputs}


def command_calls(client: redis.Redis) -> dict[str, int]:
    stats: Any = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def run_redis(args: argparse.Namespace, workload: Workload, url: str) -> dict[str, Any]:
    """The worker loop runs on this thread, which built the engine (as ``paternoster worker``
    does: one OpenMP team; stepping on another thread made a second team and cost 30% here);
    the client is a process of its own, as a web app is (in this process its GIL traffic alone
    cost ~10% of throughput)."""
    engine = make_engine(args)
    prefix = f"pn-bench-{uuid.uuid4().hex[:8]}"
    worker = build_worker(
        engine, url, WorkerConfig(prefix=prefix, stream_interval=args.stream_interval)
    )
    reader = redis.Redis.from_url(url, decode_responses=True)
    calls_before = command_calls(reader)
    served_at = time.perf_counter()  # the worker's heartbeats also cover the client's start-up
    result = serve_jobs(worker, url, [job_record(r) for r in workload])
    worker_wall_s = time.perf_counter() - served_at
    calls_after = command_calls(reader)
    stats = worker.publisher.stats
    return {
        "wall_s": result["wall_s"],
        "worker_wall_s": worker_wall_s,
        "steps": worker.num_steps,
        "outputs": result["outputs"],
        "client_reads": result["reads"],
        "redis_calls": calls_since(calls_before, calls_after),
        "publish_round_trips": stats.round_trips,
        "publish_commands": stats.commands,
    }


def job_record(r: BenchRequest) -> dict[str, Any]:
    """What job_client.py submits for one request."""
    return {"id": r.request_id, "prompt_ids": list(r.prompt_ids), "output_len": r.output_len}


def serve_jobs(worker: JobWorker, url: str, jobs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Serve ``jobs`` (`job_record`'s shape) to a client process (``job_client.py``) that
    submits them all at once and reads every result stream to its end; its report
    (``wall_s``, ``reads``, ``outputs``). The keys under the worker's prefix go afterwards."""
    reader = redis.Redis.from_url(url, decode_responses=True)
    prefix = worker.config.prefix
    with tempfile.TemporaryDirectory() as tmp:
        jobs_file, out = Path(tmp) / "jobs.json", Path(tmp) / "out.json"
        jobs_file.write_text(json.dumps(list(jobs)))
        script = Path(__file__).with_name("job_client.py")
        cmd = [sys.executable, str(script), str(jobs_file), str(out), "--redis-url", url]
        client = subprocess.Popen([*cmd, "--prefix", prefix])
        try:
            serve_until_exits(worker, client)
        finally:
            for key in reader.scan_iter(f"{prefix}:*"):
                reader.delete(key)
        if client.returncode != 0:
            raise RuntimeError(f"the bench client failed with exit code {client.returncode}")
        report: dict[str, Any] = json.loads(out.read_text())
        return report


def serve_until_exits(worker: JobWorker, client: subprocess.Popen[bytes]) -> None:
    """Run the worker here until the client process exits (killed if the worker fails)."""

    def stop_when_client_exits() -> None:
        client.wait()
        worker.stop()

    threading.Thread(target=stop_when_client_exits, daemon=True).start()
    try:
        worker.run()
    finally:
        if client.poll() is None:
            client.kill()


def calls_since(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    delta = {k: v - before.get(k, 0) for k, v in after.items()}
    return {k: v for k, v in delta.items() if v > 0 and k not in BENCH_COMMANDS}


def summarize(run: dict[str, Any], output_tokens: int) -> dict[str, Any]:
    out = {k: v for k, v in run.items() if k != "outputs"}
    out["output_tok_s"] = output_tokens / run["wall_s"]
    if "redis_calls" in run:
        total = sum(run["redis_calls"].values())
        out["redis_commands"] = total
        out["redis_commands_per_token"] = total / output_tokens
        out["publish_round_trips_per_step"] = run["publish_round_trips"] / max(1, run["steps"])
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_arguments(p)
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=1, help="alternate the systems this many times")
    p.add_argument("--stream-interval", type=int, default=1)
    p.add_argument("--out", type=Path)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.model_dir = resolve_model_dir(args.model)
    vocab = ModelConfig.from_dir(args.model_dir).vocab_size
    args.token_ids = normal_token_ids(load_tokenizer(args.model_dir), vocab)
    workload = make_workload(args.num_requests, args.seed, args.scale, args.token_ids)
    totals = workload_totals(workload)
    url, embedded = resolve_redis_url()
    rounds: list[dict[str, Any]] = []
    for i in range(args.rounds):
        print(f"round {i + 1}: engine ...", flush=True)
        eng = in_worker_thread(lambda: run_engine(args, workload))
        print(f"  engine {eng['wall_s']:.1f} s; redis ...", flush=True)
        red = in_worker_thread(lambda: run_redis(args, workload, url))
        print(f"  redis {red['wall_s']:.1f} s", flush=True)
        if red["outputs"] != eng["outputs"]:
            raise RuntimeError("the Redis path produced different tokens from the engine")
        e, r = summarize(eng, totals["output_tokens"]), summarize(red, totals["output_tokens"])
        rounds.append(
            {"engine": e, "redis": r, "redis_over_engine": r["output_tok_s"] / e["output_tok_s"]}
        )
    if embedded is not None:
        embedded.close()
    report = {
        "workload": totals,
        "environment": environment(args.threads),
        "redis_url": url,
        "stream_interval": args.stream_interval,
        "rounds": rounds,
    }
    print_report(report)
    write_report(report, args.out)
    return report


def print_report(report: dict[str, Any]) -> None:
    t = report["workload"]
    print(
        f"\n{t['num_requests']} jobs: {t['prompt_tokens']} prompt + {t['output_tokens']} "
        f"output tokens; stream interval {report['stream_interval']}"
    )
    for i, r in enumerate(report["rounds"]):
        e, d = r["engine"], r["redis"]
        print(
            f"round {i + 1}: engine {e['output_tok_s']:.1f} tok/s ({e['wall_s']:.1f} s), "
            f"redis {d['output_tok_s']:.1f} tok/s ({d['wall_s']:.1f} s): "
            f"ratio {r['redis_over_engine']:.3f}"
        )
        print(
            f"  Redis commands per output token {d['redis_commands_per_token']:.3f} "
            f"({d['redis_commands']} commands: {d['redis_calls']}); publish round trips per "
            f"step {d['publish_round_trips_per_step']:.2f}"
        )


if __name__ == "__main__":
    main()
