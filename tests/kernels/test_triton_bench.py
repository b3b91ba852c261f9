"""`ops/bench/kernels.py --tiny` runs end to end on CPU, so the benchmark cannot silently rot."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "ops" / "bench" / "kernels.py"


def load_bench() -> ModuleType:
    # Loaded under another name: the script's own name, kernels, is the package it benchmarks.
    spec = importlib.util.spec_from_file_location("paternoster_bench_kernels", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_bench_tiny_grid(tmp_path: Path) -> None:
    bench = load_bench()
    out = tmp_path / "bench.json"
    results = bench.main(["--tiny", "--out", str(out)])
    assert json.loads(out.read_text()) == results
    assert results["copy_gbps"] > 0
    configs = results["configs"]
    assert len(configs) == 4
    for r in configs:
        assert r["triton_gbps"] > 0 and r["sdpa_us"] > 0
        assert r["rel_err_vs_reference"] < 1e-5 and r["rel_err_vs_sdpa"] < 1e-5


def test_bench_split_variants() -> None:
    bench = load_bench()
    argv = ["--tiny", "--batches", "3", "--contexts", "300", "--grid-max-len", "4096"]
    results = bench.main([*argv, "--splits", "1:64,8:64,16:512"])
    configs = results["configs"]
    # 16 splits of a 4096-token grid would be 256 tokens: at least 512 makes them 8.
    assert [(r["num_splits"], r["min_split_len"]) for r in configs] == [(1, 64), (8, 64), (8, 512)]
    for r in configs:
        assert r["grid_max_len"] == 4096 and r["context"] == 300
        assert r["triton_gbps"] > 0 and r["rel_err_vs_reference"] < 1e-5
        assert "sdpa_us" not in r  # the variants time the kernel alone
