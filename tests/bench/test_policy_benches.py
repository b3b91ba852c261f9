"""The priority and chaos benchmarks on the tiny model: every configuration runs and the numbers
hang together (they measure nothing about speed here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.bench.scripts import load_script as load


@pytest.mark.slow
def test_priority_bench_tiny(tmp_path: Path, tiny_model_dir: Path) -> None:
    bench = load("priority")
    args = ["--model", str(tiny_model_dir), "--batch-jobs", "8", "--interactive-jobs", "3"]
    args += ["--scale", "0.5", "--max-num-seqs", "4", "--max-num-batched-tokens", "64"]
    # Chats arrive after the backlog's fourth step: by then batch jobs hold every slot (a
    # 64-token budget admits 48-token prompts over 3 steps), however slow the machine. By wall
    # time alone, a loaded CI machine let them in after the first step, into free slots, and
    # no preemption was needed. The rest comes soon: a quiet machine finishes the backlog
    # (2 waves of 48-token jobs) in ~0.1 s.
    args += ["--interactive-after-steps", "4"]
    args += ["--interactive-start-s", "0.0", "--interactive-every-s", "0.005"]
    args += ["--threads", str(torch.get_num_threads()), "--kv-cache-bytes", str(16 << 20)]
    report = bench.main([*args, "--out", str(tmp_path / "out.json")])
    runs = report["runs"]
    assert set(runs) == {"idle", "fifo", "priority", "preempt"}
    assert sum(runs["preempt"]["preemptions"].values()) > 0
    assert runs["priority"]["preemptions"] == {} and runs["fifo"]["preemptions"] == {}
    assert runs["priority"]["prompt_tokens_recomputed"] == 0
    for run in runs.values():
        assert 0 < run["ttft_p50_s"] <= run["ttft_p99_s"] <= run["ttft_max_s"]
    assert report["ratios"]["batch_outputs_identical"] is True
    assert (tmp_path / "out.json").is_file()


@pytest.mark.slow
def test_chaos_bench_tiny(tmp_path: Path, tiny_model_dir: Path) -> None:
    bench = load("chaos")
    args = ["--model", str(tiny_model_dir), "--jobs", "24", "--max-tokens", "30", "--workers", "2"]
    args += ["--kills", "1", "--fault-window-s", "8", "--timeout-s", "120"]
    args += ["--step-delay-s", "0.02"]
    args += ["--log-dir", str(tmp_path), "--out", str(tmp_path / "chaos.json")]
    report = bench.main(args)
    s = report["summary"]
    assert sorted(f["fault"] for f in report["faults"]) == ["kill -9", "redis restart"]
    assert (s["lost"], s["duplicated"], s["gaps"], s["repeats"]) == (0, 0, 0, 0), s
    assert s["done"] == 24
