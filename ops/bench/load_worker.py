"""``load.py``'s worker: ``paternoster worker`` as a subprocess, as it runs in production (its
model loop on its own main thread, its own OpenMP team), started on a fresh key prefix with
``--metrics-port 0`` (the port it picks is read from its log) and awaited until /health is 200.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
METRICS_LINE = re.compile(r"metrics: http://[^\s:]+:(\d+)/metrics")


def worker_command(args: argparse.Namespace, url: str, prefix: str) -> list[str]:
    cmd = [sys.executable, "-m", "worker.cli", "worker", "--redis-url", url, "--prefix", prefix]
    cmd += ["--metrics-port", "0", "--log-level", "warning", "--threads", str(args.threads)]
    cmd += ["--stream-interval", str(args.stream_interval), "--block-size", str(args.block_size)]
    cmd += ["--model", str(args.model_dir)]
    for flag in ("max_num_seqs", "max_num_batched_tokens", "kv_cache_bytes", "max_model_len"):
        if getattr(args, flag) is not None:
            cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    return cmd + list(args.worker_arg)


def start(args: argparse.Namespace, url: str, prefix: str, log: Path) -> tuple[Any, str]:
    """The worker subprocess and its /metrics URL, once /health answers 200."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("w") as f:
        proc = subprocess.Popen(worker_command(args, url, prefix), cwd=REPO, env=env, stderr=f)
    deadline = time.monotonic() + args.startup_timeout_s
    port = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        if port is None and (m := METRICS_LINE.search(log.read_text())):
            port = m.group(1)
        if port is not None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        return proc, f"http://127.0.0.1:{port}/metrics"
            except OSError:
                pass  # 503 while starting, or not listening yet
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the worker was not healthy within {args.startup_timeout_s} s")


def stop(proc: Any) -> None:
    proc.terminate()  # SIGTERM: the worker finishes its step and says goodbye
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
