"""`ops/bench/worker_host.py` at a tiny size against Redis: the report's structure, never its
timings."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.bench.scripts import load_script


def test_worker_host_reports_each_part_per_batch(
    tmp_path: Path, tiny_model_dir: Path, redis_url: str
) -> None:
    bench = load_script("worker_host")
    out = tmp_path / "worker.json"
    args = ["--batches", "2", "4", "--steps", "3", "--warmup", "1", "--shape", "tiny"]
    args += ["--tokenizer", str(tiny_model_dir), "--redis-url", redis_url, "--out", str(out)]
    args += ["--threads", str(torch.get_num_threads())]
    report = bench.main(args)

    assert json.loads(out.read_text()) == report
    assert [r["batch"] for r in report["batches"]] == [2, 4]
    for r in report["batches"]:
        ms = r["median_ms"]
        assert r["steps"] == 3 and set(ms) == set(bench.PARTS)
        # Every part ran on its thread: the loop's engine and service work, the publisher's.
        assert ms["engine_host"] > 0 and ms["service_loop"] > 0 and ms["publisher"] > 0
        assert ms["forward"] > 0 and ms["worker_host"] > ms["publisher"]
        assert r["worker_steps"] > r["steps"]  # prefill and warm-up steps are not kept
    lines = report["markdown"].splitlines()
    assert lines[0] == "| CPU ms per all-decode step | B=2 | B=4 |"
    assert sum("publisher thread" in line for line in lines) == 1
