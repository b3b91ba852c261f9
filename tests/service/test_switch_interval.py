"""``--switch-interval-ms``: the worker lowers the interpreter's switch interval while it serves."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from producer import Producer
from tests.service.conftest import running_worker, tiny_engine
from worker.cli import build_parser
from worker.service.config import InvalidWorkerConfig, WorkerConfig


@pytest.fixture
def saved_interval() -> Iterator[float]:
    saved = sys.getswitchinterval()
    try:
        yield saved
    finally:
        sys.setswitchinterval(saved)


def test_the_flag_fills_the_field_and_a_bad_value_is_refused() -> None:
    args = build_parser().parse_args(["worker", "--switch-interval-ms", "0.5"])
    assert WorkerConfig.from_args(args).switch_interval_ms == 0.5
    assert WorkerConfig.from_args(build_parser().parse_args(["worker"])).switch_interval_ms is None
    with pytest.raises(InvalidWorkerConfig, match="switch_interval_ms"):
        WorkerConfig(switch_interval_ms=0)


def test_serving_lowers_it_and_never_raises_it(
    tiny_model_dir: Path, redis_url: str, prefix: str, saved_interval: float
) -> None:
    sys.setswitchinterval(0.005)
    engine = tiny_engine(tiny_model_dir)
    with (
        running_worker(engine, redis_url, prefix, switch_interval_ms=0.5),
        Producer(redis_url, prefix=prefix) as p,
    ):
        assert p.submit("hi", max_tokens=2).result(timeout_s=30).text is not None
        assert sys.getswitchinterval() == pytest.approx(0.0005, abs=2e-6)
    sys.setswitchinterval(0.0001)
    with running_worker(engine, redis_url, prefix, switch_interval_ms=0.5):
        pass
    assert sys.getswitchinterval() == pytest.approx(0.0001, abs=2e-6)  # lower already: kept
