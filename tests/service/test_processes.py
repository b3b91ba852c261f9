"""``paternoster worker`` and ``paternoster demo`` as real processes on one Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import redis

from producer import JobState, Producer
from tests.service.streams import check_stream

pytestmark = pytest.mark.slow


def start_worker(
    model_dir: Path,
    url: str,
    prefix: str,
    name: str,
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[str]:
    cmd = [
        sys.executable,
        "-m",
        "worker.cli",
        "worker",
        "--model",
        str(model_dir),
        "--redis-url",
        url,
        "--prefix",
        prefix,
        "--name",
        name,
        "--max-jobs",
        "2",
        "--block-size",
        "4",
        "--num-blocks",
        "256",
        "--max-num-seqs",
        "4",
        "--threads",
        "1",
        *extra,
    ]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )


def wait_for_consumers(
    url: str, prefix: str, names: set[str], procs: list[subprocess.Popen[str]]
) -> None:
    client = redis.Redis.from_url(url, decode_responses=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(
                    f"worker exited early:\n{proc.stdout.read() if proc.stdout else ''}"
                )
        try:
            consumers = {c["name"] for c in client.xinfo_consumers(f"{prefix}:jobs", "workers")}
        except redis.ResponseError:  # no stream or group yet
            consumers = set()
        if names <= consumers:
            return
        time.sleep(0.1)
    raise AssertionError("workers did not join the consumer group in time")


def test_two_workers_split_the_jobs_and_each_runs_once(
    tiny_model_dir: Path, redis_url: str, prefix: str
) -> None:
    names = {"worker-a", "worker-b"}
    procs = [start_worker(tiny_model_dir, redis_url, prefix, n) for n in sorted(names)]
    try:
        wait_for_consumers(redis_url, prefix, names, procs)
        with Producer(redis_url, prefix=prefix) as p:
            handles = [
                p.submit(f"job {i}", max_tokens=24, temperature=0.0, ignore_eos=True)
                for i in range(16)
            ]
            results = [h.result(timeout_s=120) for h in handles]
            streams = [list(p.stream(h.job_id)) for h in handles]
            workers = Counter(p.status(h.job_id).worker for h in handles)
            assert p.redis.xpending(p.keys.jobs, p.keys.group)["pending"] == 0
        for result, events in zip(results, streams, strict=True):
            assert result.state is JobState.DONE
            assert len(check_stream(events)) == 24  # one started, one terminal: ran once
        assert set(workers) == names, workers  # both took a share
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0, out
            assert '"event": "worker_stopped"' in out
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_demo_streams_mixed_jobs_through_redis(tiny_model_dir: Path, redis_url: str) -> None:
    env = {**os.environ, "REDIS_URL": redis_url}
    cmd = [
        sys.executable,
        "-m",
        "worker.cli",
        "demo",
        "--model",
        str(tiny_model_dir),
        "--threads",
        "1",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("chat-capital", "long-prompt", "long-generation"):
        assert f"[{name}] +" in proc.stdout  # token events arrived one by one
        assert f"[{name}] done" in proc.stdout
    assert "ttft" in proc.stdout and "5 jobs" in proc.stdout
    client = redis.Redis.from_url(redis_url)
    assert not list(client.scan_iter("paternoster-demo-*")), "the demo left keys behind"
