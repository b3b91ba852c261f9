"""The helpers every bench shares (ops/bench/common.py, our_engine.py), without a model."""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path

import pytest

from ops.bench.common import args_record, in_worker_thread, median_seconds, write_report
from ops.bench.our_engine import add_engine_arguments, engine_config
from worker.engine.config import SchedulerConfig


def test_in_worker_thread_runs_elsewhere_and_reraises_here() -> None:
    caller = threading.get_ident()
    assert in_worker_thread(threading.get_ident) != caller

    def fails() -> None:
        raise KeyError("from the bench thread")

    with pytest.raises(KeyError, match="from the bench thread"):
        in_worker_thread(fails)


def test_write_report_makes_the_folder_and_skips_without_a_path(tmp_path: Path) -> None:
    out = tmp_path / "new" / "dir" / "r.json"
    write_report({"path": tmp_path}, out, default=str)
    assert json.loads(out.read_text()) == {"path": str(tmp_path)}
    write_report({"x": 1}, None)  # no --out: nothing written, nothing raised
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]


def test_median_seconds_warms_up_once_and_syncs_every_call() -> None:
    calls, syncs = [], []
    seconds = median_seconds(lambda: calls.append(1), 4, lambda: syncs.append(1))
    assert len(calls) == len(syncs) == 5  # one untimed warm-up, four timed
    assert seconds >= 0.0


def test_engine_flags_fill_the_engine_config() -> None:
    p = argparse.ArgumentParser()
    add_engine_arguments(p, max_num_seqs=16)
    args = p.parse_args(["--kv-cache-bytes", "8e6", "--threads", "3"])
    config = engine_config(args, "some-model")
    assert config.cache.memory_bytes == 8_000_000  # "8e6" reads as a count of bytes
    assert config.scheduler.max_num_seqs == 16  # the bench's budget
    assert config.scheduler.max_num_batched_tokens == SchedulerConfig.max_num_batched_tokens
    assert (config.model, config.device, config.num_threads) == ("some-model", "cpu", 3)
    assert args_record(args, skip=["threads"])["kv_cache_bytes"] == 8_000_000
    assert "threads" not in args_record(args, skip=["threads"])
