"""`ops/bench/tpot_burst.py` at tiny sizes: the report's structure, and what holds at any
machine speed (aging's bound, no batch start under the chat stream), never its timings."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.bench.scripts import load_script


@pytest.mark.slow  # five engines: ~20 s on the shared 2 cores
def test_burst_and_starvation_report_and_aging_bounds_the_batch_wait(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    bench = load_script("tpot_burst")
    args = ["--model", str(tiny_model_dir), "--threads", str(torch.get_num_threads())]
    args += ["--chats", "2", "--chat-tokens", "12", "--long-prompts", "2", "--long-len", "64"]
    args += ["--batch-jobs", "3", "--batch-tokens", "2", "--slots", "2", "--stream-s", "1.5"]
    args += ["--aging-per-s", "40", "--stream-chat-tokens", "4", "--out", str(tmp_path / "r.json")]
    report = bench.main(args)
    assert set(report["burst"]) == {"alone", "off", "on"}
    assert report["burst"]["alone"]["p50_over_alone"] == 1.0
    assert all(r["tokens_measured"] > 0 for r in report["burst"].values())
    aged, plain = report["starvation"]
    # Aged: no batch job starts before it has waited 20 / 40 s; all end.
    assert aged["batch_first_token_min_s"] >= aged["bound_s"] == 0.5
    assert aged["batch_finished_max_s"] >= aged["batch_first_token_min_s"]
    # Without aging none starts while chats keep coming (the batch is full whatever the speed).
    assert plain["batch_arrived_s"] + plain["batch_first_token_min_s"] >= 1.5
    assert plain["batch_finished_during_stream"] == 0
