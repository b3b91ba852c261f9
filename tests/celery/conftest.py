"""Fixtures of the Celery bridge tests: a real ``celery worker`` subprocess on the test Redis and
a real Paternoster JobWorker on the tiny model, both for this package's tests (starting them costs
seconds), with key prefixes of their own that are deleted afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from producer import Producer
from tests.celery.app import BROKER_ENV, CELERY_PREFIX_ENV, JOB_PREFIX_ENV, broker_url, make_app
from tests.service.conftest import running_worker, tiny_engine
from worker.service.worker import JobWorker

ROOT = Path(__file__).resolve().parents[2]
WORKER_START_S = 60  # a cold start on 2 busy cores; it is ready in about 3 s here


@pytest.fixture(scope="package")
def celery_prefixes() -> Iterator[tuple[str, str]]:
    """(the Celery keys' prefix, the Paternoster jobs' prefix) for this session."""
    tag = uuid.uuid4().hex[:12]
    yield f"pn-test-celery-{tag}:", f"pn-test-jobs-{tag}"


@pytest.fixture(scope="package")
def celery_app(redis_url: str, celery_prefixes: tuple[str, str]) -> Iterator[Any]:
    celery_prefix, job_prefix = celery_prefixes
    app = make_app(broker_url(redis_url), celery_prefix, redis_url, job_prefix)
    yield app
    app.close()
    client = redis.Redis.from_url(redis_url)
    for prefix in (celery_prefix, f"_kombu.binding.{celery_prefix}", job_prefix + ":"):
        keys = list(client.scan_iter(match=f"*{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    client.close()


class SlowStep:
    """Wraps an engine's ``step`` with a sleep, so a test can keep a job running long enough to
    revoke it (the tiny model makes a token in about a millisecond)."""

    def __init__(self, step: Callable[[], Any]) -> None:
        self.step = step
        self.delay_s = 0.0

    def __call__(self) -> Any:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.step()


@pytest.fixture(scope="package")
def job_worker(
    redis_url: str, tiny_model_dir: Path, celery_prefixes: tuple[str, str]
) -> Iterator[JobWorker]:
    engine = tiny_engine(tiny_model_dir)
    engine.step = SlowStep(engine.step)  # type: ignore[method-assign]
    with running_worker(engine, redis_url, celery_prefixes[1]) as worker:
        yield worker


@pytest.fixture
def slow_steps(job_worker: JobWorker) -> Iterator[SlowStep]:
    slow: SlowStep = job_worker.engine.step  # type: ignore[assignment]
    yield slow
    slow.delay_s = 0.0


@pytest.fixture(scope="package")
def celery_worker(
    redis_url: str, celery_prefixes: tuple[str, str], celery_app: Any, job_worker: JobWorker
) -> Iterator[subprocess.Popen[bytes]]:
    """``celery worker`` with the threads pool: the pool that sees a plain revoke of a running
    task (prefork children do not; solo runs control commands only between tasks)."""
    env = {
        **os.environ,
        BROKER_ENV: broker_url(redis_url),
        CELERY_PREFIX_ENV: celery_prefixes[0],
        JOB_PREFIX_ENV: celery_prefixes[1],
        "REDIS_URL": redis_url,
    }
    name = f"pn-test-{uuid.uuid4().hex[:8]}@%h"
    cmd = [sys.executable, "-m", "celery", "-A", "tests.celery.app", "worker", "--pool", "threads"]
    cmd += ["-c", "4", "-n", name, "--loglevel", "warning", "--without-gossip", "--without-mingle"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    try:
        _wait_ready(celery_app, proc)
        yield proc
    finally:
        proc.terminate()  # warm shutdown: running tasks finish first
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(app: Any, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + WORKER_START_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"celery worker exited with {proc.returncode}"
        if app.control.ping(timeout=0.5):
            return
    raise AssertionError(f"celery worker not ready within {WORKER_START_S} s")


@pytest.fixture
def jobs(redis_url: str, celery_prefixes: tuple[str, str]) -> Iterator[Producer]:
    """A Producer on the jobs' prefix, to check what the tasks did to their jobs."""
    with Producer(redis_url, prefix=celery_prefixes[1]) as p:
        yield p
