"""`ops/bench/kernels.py --tiny` runs end to end on CPU, so the benchmark cannot silently rot."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "ops" / "bench" / "kernels.py"


def test_bench_tiny_grid(tmp_path: Path) -> None:
    # Loaded under another name: the script's own name, kernels, is the package it benchmarks.
    spec = importlib.util.spec_from_file_location("paternoster_bench_kernels", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    results = bench.main(["--tiny", "--out", str(out)])
    assert json.loads(out.read_text()) == results
    assert results["copy_gbps"] > 0
    configs = results["configs"]
    assert len(configs) == 4
    for r in configs:
        assert r["triton_gbps"] > 0 and r["sdpa_us"] > 0
        assert r["rel_err_vs_reference"] < 1e-5 and r["rel_err_vs_sdpa"] < 1e-5
