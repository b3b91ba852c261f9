"""``ops/bench/load.py`` end to end on the tiny model: a worker subprocess, the open-loop client
and the /metrics sampler, one rate, seven jobs; the report must account for every job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.bench.scripts import load_script as load

# Seed 1 draws all three classes among 7 jobs: 4 chats, 2 cancelled, 1 batch (refused below).
SMOKE_MIX = {
    "name": "smoke",
    "classes": [
        {
            "name": "chat",
            "weight": 2,
            "prompt_len": [8, 24],
            "output_len": [8, 24],
            "priority": "interactive",
            "tenants": ["a", "b"],
        },
        # 150+ tokens at a few ms each on the tiny model; cancelled after 5-10% of them, so the
        # cancel lands mid-stream with ~100 steps to spare.
        {
            "name": "cancelled",
            "weight": 1,
            "prompt_len": [8, 16],
            "output_len": [150, 200],
            "tenants": ["a"],
            "cancel_fraction": 1.0,
            "cancel_after_fraction": [0.05, 0.1],
        },
        {
            "name": "batch",
            "weight": 1,
            "prompt_len": [8, 16],
            "output_len": [8, 16],
            "priority": "batch",
            "tenants": ["b"],
        },
    ],
}


def ordered(p: dict[str, float | None]) -> bool:
    return p["p50"] is not None and p["p50"] <= p["p90"] <= p["p99"]  # type: ignore[operator]


@pytest.mark.slow  # ~30 s: two processes import torch, the worker builds an engine
def test_load_bench_tiny(tmp_path: Path, tiny_model_dir: Path, redis_url: str) -> None:
    bench = load("load")
    (tmp_path / "mix.json").write_text(json.dumps(SMOKE_MIX))
    out = tmp_path / "results"
    args = ["--model", str(tiny_model_dir), "--mix", str(tmp_path / "mix.json"), "--rates", "8"]
    args += ["--num-jobs", "7", "--seed", "1", "--out-dir", str(out), "--redis-url", redis_url]
    args += ["--threads", str(torch.get_num_threads()), "--kv-cache-bytes", str(16 << 20)]
    args += ["--admission-limit", "band:batch:jobs=0", "--timeout-s", "120"]  # batch: refused
    report = bench.main(args)
    assert json.loads((out / "report.json").read_text()) == json.loads(json.dumps(report))

    (run,) = report["runs"]
    jobs = run["jobs"]
    assert len(jobs) == 7 and run["workload"]["num_jobs"] == 7
    by_class = {c: [j for j in jobs if j["klass"] == c] for c in ("chat", "cancelled", "batch")}
    assert [len(v) for v in by_class.values()] == [4, 2, 1]
    assert all(j["outcome"] == "done" for j in by_class["chat"])
    assert all(len(j["token_times_s"]) == j["max_tokens"] for j in by_class["chat"])
    assert all(j["outcome"] == "cancelled" for j in by_class["cancelled"])
    assert all(j["outcome"] == "rejected" for j in by_class["batch"])

    overall = run["overall"]
    assert sum(overall["outcomes"].values()) == 7
    assert overall["outcomes"] == {
        "done": 4,
        "cancelled": 2,
        "error": 0,
        "expired": 0,
        "rejected": 1,
        "timeout": 0,
    }
    assert run["rejections"] == 1
    assert run["cancellations"]["planned"] == run["cancellations"]["honoured"] == 2
    for key in ("ttft_s", "e2e_s", "queue_s"):
        assert ordered(overall[key]) and overall[key]["p50"] >= 0, key
        assert overall[key]["n"] == (6 if key != "e2e_s" else 4)
    assert ordered(overall["tpot_s"]) and ordered(run["classes"]["chat"]["ttft_s"])
    assert overall["output_tok_s"] > 0 and overall["completed_jobs_per_s"] > 0
    assert overall["output_tokens"] == sum(len(j["token_times_s"]) for j in jobs)
    assert run["worker_generated_tokens"] >= overall["output_tokens"]
    assert set(run["preemptions"]) == {"priority", "kv_cache_full"}
    assert run["kv"]["samples"] and run["kv"]["kv_total_blocks"] > 0
    assert 0 <= run["kv"]["max_kv_usage"] <= 1
    # Model work against the machine's matmul ceiling, measured in the same run.
    assert report["matmul_ceiling_gflop_s"] > 1
    assert run["ceiling_fraction"] == run["model_gflop_s"] / report["matmul_ceiling_gflop_s"] > 0

    kv = run["kv_memory"]
    assert kv["jobs"] == 6 and kv["context_len"] == 512  # the tiny model's context
    assert kv["paged"]["useful_fraction"] > kv["contiguous_context"]["useful_fraction"] > 0
    for name in report["plots"]:
        assert Path(name).stat().st_size > 10_000
    assert {Path(p).name for p in report["plots"]} == {
        "latency_cdf_rate8.png",
        "throughput.png",
        "kv_usage.png",
    }


def test_paternoster_bench_passes_its_flags_to_load_py(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from worker.cli import main

    (tmp_path / "mix.json").write_text('{"classes": []}')
    assert main(["bench", "--mix", str(tmp_path / "mix.json"), "--rates", "1"]) == 2
    assert "non-empty 'classes'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert "--admission-limit" in capsys.readouterr().out
