"""`ops/bench/engine.py` runs end to end on the tiny model, so the benchmark cannot silently rot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.bench.scripts import load_script


def test_engine_bench_tiny(tmp_path: Path, tiny_model_dir: Path) -> None:
    bench = load_script("engine")
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


def test_random_model_runs_and_a_failing_peer_is_recorded(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The GPU lease's path (ops/bench/gpu_check.sh) on the CPU: random weights in a named shape
    # with a real tokenizer, then the engine bench with --keep-going, where one peer fails.
    from worker.models.config import ModelConfig

    model_dir = tmp_path / "model"
    load_script("random_model").main(
        ["--shape", "tiny", "--tokenizer", str(tiny_model_dir), "--out", str(model_dir)]
    )
    mc = ModelConfig.from_dir(model_dir)
    assert (mc.num_layers, mc.hidden_size, mc.num_kv_heads) == (2, 64, 2)
    assert mc.vocab_size == ModelConfig.from_dir(tiny_model_dir).vocab_size
    assert (model_dir / "tokenizer.json").exists()

    bench = load_script("engine")

    def broken(*args: Any) -> Any:
        raise RuntimeError("peer exploded")

    # HF_RUNNERS lives in ops.bench.hf_peers, shared by every load of engine.py: patch it
    # for this test only.
    monkeypatch.setitem(bench.HF_RUNNERS, "hf-static", broken)
    args = ["--model", str(model_dir), "--systems", "ours,hf-static", "--keep-going"]
    args += ["--num-requests", "3", "--scale", "0.05", "--dtype", "float32"]
    args += ["--threads", str(torch.get_num_threads()), "--kv-cache-bytes", str(16 << 20)]
    report = bench.main(args)
    assert report["failed"] == {"hf-static": "RuntimeError: peer exploded"}
    assert set(report["systems"]) == {"ours"}
    assert report["systems"]["ours"]["output_tokens"] == report["workload"]["output_tokens"] > 0
    assert report["config"]["dtype"] == "float32" and report["config"]["device"] == "cpu"


def test_hf_cb_page_size_field_by_transformers_version() -> None:
    """transformers 5.17.0 names a page's tokens ``block_size``; later releases ``page_size``
    (5.17.0's config refused ``page_size`` on the H200): the bench passes the one there is."""
    from dataclasses import dataclass

    from transformers import ContinuousBatchingConfig

    from ops.bench.hf_peers import page_field

    @dataclass
    class Config517:  # 5.17.0's fields, in part
        block_size: int = 256
        num_blocks: int | None = None

    assert page_field(Config517) == "block_size"
    field = page_field(ContinuousBatchingConfig)
    assert getattr(ContinuousBatchingConfig(**{field: 32}), field) == 32
