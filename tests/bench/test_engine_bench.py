"""`ops/bench/engine.py` runs end to end on the tiny model, so the benchmark cannot silently rot."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[2] / "ops" / "bench" / "engine.py"


def test_engine_bench_tiny(tmp_path: Path, tiny_model_dir: Path) -> None:
    spec = importlib.util.spec_from_file_location("paternoster_bench_engine", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # dataclasses look their module up while the class is built
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    args = ["--model", str(tiny_model_dir), "--systems", "ours,hf-static", "--out", str(out)]
    args += ["--num-requests", "5", "--scale", "0.05", "--seed", "3"]
    # The current thread count: the script sets it process-wide, so leave it as it was.
    args += ["--threads", str(torch.get_num_threads()), "--kv-cache-bytes", str(16 << 20)]
    report = bench.main(args)
    assert json.loads(out.read_text()) == report

    from worker.models.loader import load_tokenizer

    token_ids = bench.normal_token_ids(load_tokenizer(tiny_model_dir), 49152)
    workload = bench.make_workload(5, 3, 0.05, token_ids)
    totals = report["workload"]
    assert totals["num_requests"] == 5
    assert totals["prompt_tokens"] == sum(len(r.prompt_ids) for r in workload)
    assert totals["output_tokens"] == sum(r.output_len for r in workload) > 0
    assert set(report["systems"]) == {"ours", "hf-static"}
    for s in report["systems"].values():
        assert s["output_tokens"] == totals["output_tokens"]
        assert s["wall_s"] > 0 and s["output_tok_s"] > 0 and s["total_tok_s"] > 0
        assert s["model_gflop_s"] > 0 and s["ours_speedup"] > 0
    assert report["systems"]["ours"]["steps"] > 0
    assert report["matmul_gflop_s"] > 0
    assert report["parity_vs_ours"]["hf-static"]["checked"] == 5
