"""Open-loop load through the whole job path: a mix's arrivals against ``paternoster worker``.

    python ops/bench/load.py --rates 0.1,0.2,0.4 --num-jobs 64           # default mix, SmolLM2
    python ops/bench/load.py --rates 4 --num-jobs 6 --scale 0.1          # smoke run
    paternoster bench --mix my_mix.json --rates 1 --duration-s 120

For each rate, three processes: ``paternoster worker`` (a subprocess on a fresh key prefix, with
``--metrics-port``), the client (``load_client.py``: submits every job at its arrival time
whatever has finished, follows the streams, cancels the chosen jobs), and this one, which
scrapes the worker's /metrics every 0.5 s (``load_sampler.py``). Redis is ``--redis-url``, else
``REDIS_URL``, else an embedded one. The workload (``workload.py``) is generated once: with
``--num-jobs`` every rate runs the same jobs, only their arrivals closer together.

Written to ``--out-dir``: ``report.json`` (per rate, overall and per class: p50/p90/p99 of TTFT,
TPOT, end-to-end latency and queue wait; completed jobs/s, output tokens/s; KV usage over time;
preemptions, rejections, cancellations honoured; KV memory of paged against contiguous
allocation, ``kv_memory.py``), the figures (``plots.py``) and each rate's worker log.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.append(str(Path(__file__).resolve().parent))

import kv_memory
import load_report
import load_sampler
import load_worker
import plots
import workload as wl

from ops.bench.common import environment, matmul_gflops
from ops.bench.engine_workload import BenchRequest, normal_token_ids, useful_flops
from producer import Producer
from producer.admission import Cap, set_limits
from producer.connection import resolve_redis_url

REPO = Path(__file__).resolve().parents[2]
WARMUP_TOKENS = 4  # one short job before the clock starts: the first forward pays for setup


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="paternoster bench", description=__doc__.splitlines()[0])
    p.add_argument("--mix", type=Path, default=wl.DEFAULT_MIX, help="a mix JSON file")
    p.add_argument("--rates", default="0.1,0.2,0.4", help="offered jobs/s, comma separated")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--num-jobs", type=int, help="jobs per rate (default 64)")
    size.add_argument("--duration-s", type=float, help="arrivals for this long at each rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every length range")
    p.add_argument("--model", help="HF directory or .gguf; default the bundled SmolLM2-135M")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--kv-cache-bytes", type=int)
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--stream-interval", type=int, default=1)
    p.add_argument("--worker-arg", action="append", default=[], help="passed on to the worker")
    p.add_argument(
        "--admission-limit",
        action="append",
        default=[],
        metavar="SCOPE:KIND=N",
        help="e.g. band:batch:jobs=8 or tenant:acme:tokens=4000 (producer.admission)",
    )
    p.add_argument("--redis-url")
    p.add_argument("--out-dir", type=Path, default=REPO / "ops" / "bench" / "results" / "load")
    p.add_argument("--sample-every-s", type=float, default=0.5)
    p.add_argument("--timeout-s", type=float, default=3600.0, help="per rate")
    p.add_argument("--startup-timeout-s", type=float, default=600.0)
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    args.rates = [float(r) for r in args.rates.split(",") if r.strip()]
    if args.duration_s is None and args.num_jobs is None:
        args.num_jobs = 64
    return args


def apply_limits(producer: Producer, items: Sequence[str]) -> None:
    for item in items:
        scope_kind, _, value = item.partition("=")
        scope, _, kind = scope_kind.rpartition(":")
        if kind not in ("jobs", "tokens") or not scope or not value.isdigit():
            raise ValueError(f"--admission-limit takes SCOPE:KIND=N, got {item!r}")
        set_limits(producer.redis, producer.keys, scope, Cap(**{kind: int(value)}))


def run_rate(
    args: argparse.Namespace, jobs: list[wl.WorkloadJob], rate: float, url: str
) -> dict[str, Any]:
    prefix = f"pn-load-{uuid.uuid4().hex[:8]}"
    log = args.out_dir / f"worker-rate{rate:g}.log"
    proc, metrics_url = load_worker.start(args, url, prefix, log)
    producer = Producer(url, prefix=prefix)
    try:
        warm = producer.submit(
            prompt_token_ids=jobs[0].prompt_token_ids[:16],
            temperature=0.0,
            max_tokens=WARMUP_TOKENS,
            ignore_eos=True,
        )
        warm.result(timeout_s=args.startup_timeout_s)
        apply_limits(producer, args.admission_limit)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "jobs.json").write_text(json.dumps([asdict(j) for j in jobs]))
            before = load_sampler.scrape(metrics_url)
            sampler = load_sampler.Sampler(metrics_url, args.sample_every_s)
            sampler.start()
            cmd = [sys.executable, str(Path(__file__).with_name("load_client.py"))]
            cmd += [str(Path(tmp) / "jobs.json"), str(Path(tmp) / "out.json")]
            cmd += ["--redis-url", url, "--prefix", prefix, "--timeout-s", str(args.timeout_s)]
            client = subprocess.run(cmd, check=False)
            sampler.stop()
            after = load_sampler.scrape(metrics_url)
            if client.returncode != 0:
                raise RuntimeError(f"the load client failed with exit code {client.returncode}")
            client_out = json.loads((Path(tmp) / "out.json").read_text())
    finally:
        load_worker.stop(proc)
        for key in producer.redis.scan_iter(f"{prefix}:*"):
            producer.redis.delete(key)
        producer.close()
    run = load_report.summarize_run(
        client_out, sampler.samples, load_sampler.counter_delta(before, after)
    )
    run["kv_memory"] = kv_memory.from_run(
        client_out["jobs"], block_size=args.block_size, context_len=args.context_len
    )
    run["model_gflop"] = model_gflop(args, client_out["jobs"])
    run["model_gflop_s"] = run["model_gflop"] / run["duration_s"]
    run["workload"] = wl.totals(jobs)
    run["jobs"] = client_out["jobs"]
    return {"rate_per_s": rate, "prefix": prefix, "sampler_errors": sampler.errors, **run}


def model_gflop(args: argparse.Namespace, records: Sequence[dict[str, Any]]) -> float:
    """Model work of the tokens actually produced (engine_workload.useful_flops)."""
    done = [
        BenchRequest(r["job_id"], r["klass"], (0,) * r["prompt_tokens"], n)
        for r in records
        if (n := len(r["token_times_s"])) > 0
    ]
    return useful_flops(args.model_config, done)["total"] / 1e9 if done else 0.0


def fmt(p: dict[str, Any]) -> str:
    return "-" if p["p50"] is None else f"{p['p50']:.2f}/{p['p90']:.2f}/{p['p99']:.2f}"


def print_run(run: dict[str, Any]) -> None:
    o = run["overall"]
    print(
        f"rate {run['rate_per_s']:g}/s: {o['outcomes']}, {o['completed_jobs_per_s']:.3f} jobs/s, "
        f"{o['output_tok_s']:.1f} out tok/s over {run['duration_s']:.1f} s\n"
        f"  p50/p90/p99 s: TTFT {fmt(o['ttft_s'])}  TPOT {fmt(o['tpot_s'])}  "
        f"e2e {fmt(o['e2e_s'])}  queue {fmt(o['queue_s'])}\n"
        f"  KV max {run['kv']['max_kv_usage']}, preemptions {run['preemptions']}, "
        f"rejections {run['rejections']}, cancels {run['cancellations']['honoured']}/"
        f"{run['cancellations']['planned']} honoured\n"
        f"  model work {run['model_gflop_s']:.1f} GFLOP/s, "
        f"{100 * run.get('ceiling_fraction', 0.0):.1f}% of the matmul ceiling",
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    from worker.models.config import ModelConfig
    from worker.models.loader import load_tokenizer, resolve_model_dir

    args = parse_args(argv)
    mix = wl.load_mix(args.mix)
    args.model_dir = resolve_model_dir(args.model)
    args.model_config = ModelConfig.from_dir(args.model_dir)
    args.context_len = args.max_model_len or args.model_config.max_position
    vocab = normal_token_ids(load_tokenizer(args.model_dir), args.model_config.vocab_size)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    ceiling = measure_ceiling(args.threads)
    url, embedded = resolve_redis_url(args.redis_url)
    try:
        runs = [run_at(args, mix, vocab, rate, url, ceiling) for rate in args.rates]
    finally:
        if embedded is not None:
            embedded.close()
    config = {k: v for k, v in vars(args).items() if k not in ("model_config",)}
    report = {
        "config": json.loads(json.dumps(config, default=str)),
        "environment": environment(args.threads),
        "matmul_ceiling_gflop_s": ceiling,
        "mix": asdict(mix),
        "runs": runs,
    }
    report["plots"] = [] if args.no_plots else [str(p) for p in plots.write_all(runs, args.out_dir)]
    (args.out_dir / "report.json").write_text(json.dumps(report, indent=1))
    return report


def measure_ceiling(threads: int) -> float:
    """The machine's matmul ceiling with the worker's thread count, measured before any worker
    starts so nothing shares the cores: each run's model GFLOP/s is reported against it."""
    import torch

    torch.set_num_threads(threads)
    ceiling = matmul_gflops()
    print(f"matmul ceiling: {ceiling:.1f} GFLOP/s fp32 on {threads} threads", flush=True)
    return ceiling


def run_at(
    args: argparse.Namespace,
    mix: wl.Mix,
    vocab: Sequence[int],
    rate: float,
    url: str,
    ceiling: float,
) -> dict[str, Any]:
    """The mix's jobs at ``rate`` jobs/s through one worker, its figures printed."""
    jobs = wl.generate(
        mix,
        rate_per_s=rate,
        duration_s=args.duration_s,
        num_jobs=args.num_jobs,
        seed=args.seed,
        scale=args.scale,
        token_ids=vocab,
    )
    if not jobs:
        raise ValueError(f"no job arrives within --duration-s at {rate:g} jobs/s")
    print(f"rate {rate:g}/s: {len(jobs)} jobs ...", flush=True)
    run = run_rate(args, jobs, rate, url)
    run["ceiling_fraction"] = run["model_gflop_s"] / ceiling
    print_run(run)
    return run


if __name__ == "__main__":
    main()
