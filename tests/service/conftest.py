"""Fixtures for the job service: a Redis, a fresh key prefix per test, a worker on a thread."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from worker.engine.llm_engine import LLMEngine
from worker.service.build import build_worker
from worker.service.cancels import CancelListener
from worker.service.config import WorkerConfig
from worker.service.intake import Intake
from worker.service.metrics import WorkerMetrics
from worker.service.publisher import Publisher
from worker.service.worker import JobWorker

# A worker's threads that read Redis. One left running by an earlier test reads on into these
# tests: the Celery and gateway tests' workers, session-scoped until 2026-12-07, ran through
# every later directory, and one took the read that test_redis_batch.py's patched redis-py
# class was to fail, so that test failed in a CI run.
REDIS_THREADS = (Intake, Publisher, CancelListener)


@pytest.fixture(autouse=True)
def no_worker_left_running() -> None:
    """Each test here starts with no other test's worker threads still reading Redis."""
    left = [t.name for t in threading.enumerate() if isinstance(t, REDIS_THREADS) and t.is_alive()]
    assert not left, f"worker threads of an earlier test still run: {left}"


@pytest.fixture
def prefix(key_prefix: str) -> str:
    """The root conftest's per-test key prefix, under the name these tests use."""
    return key_prefix


def tiny_engine(model_dir: Path, num_blocks: int = 256, seqs: int = 8, **sched: int) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            cache=CacheConfig(block_size=4, num_blocks=num_blocks),
            scheduler=SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=64, **sched),
        )
    )


@contextlib.contextmanager
def running_worker(
    engine: LLMEngine,
    url: str,
    prefix: str,
    metrics: WorkerMetrics | None = None,
    **config: object,
) -> Iterator[JobWorker]:
    """A JobWorker serving on a thread; stopped (after its jobs end) and joined on exit."""
    settings = WorkerConfig(prefix=prefix, read_block_ms=200, **config)  # type: ignore[arg-type]
    worker = build_worker(engine, url, settings, metrics)
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            worker.run()
        except BaseException as exc:  # surfaced in the test, not lost on the thread
            errors.append(exc)

    thread = threading.Thread(target=serve, name="test-worker", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=60)
        assert not thread.is_alive(), "worker did not stop"
        if errors:
            raise errors[0]
