"""`ops/bench/host_overhead.py` runs at tiny sizes: the report's structure, never its timings."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.bench.scripts import load_script
from worker.engine.detokenizer import IncrementalDetokenizer
from worker.engine.request_state import RequestState
from worker.engine.sampling_params import SamplingParams


def test_host_overhead_reports_every_phase_per_batch(tmp_path: Path, tiny_model_dir: Path) -> None:
    bench = load_script("host_overhead")
    append, add_tokens = RequestState.append, IncrementalDetokenizer.add_tokens
    out = tmp_path / "host.json"
    args = ["--batches", "1", "4", "--steps", "3", "--warmup", "1", "--shape", "tiny"]
    args += ["--tokenizer", str(tiny_model_dir), "--out", str(out), "--sampling", "mixed"]
    args += ["--threads", str(torch.get_num_threads())]  # set process-wide: leave it as it was
    report = bench.main(args)

    assert json.loads(out.read_text()) == report
    assert (RequestState.append, IncrementalDetokenizer.add_tokens) == (append, add_tokens)
    assert report["config"]["backend"] == "cpu"
    phases = [key for key, _ in bench.PHASES]
    assert [r["batch"] for r in report["batches"]] == [1, 4]
    for r in report["batches"]:
        assert r["steps"] == len(r["step_ms_all"]) == 3
        assert set(r["median_ms"]) == {*phases, "step"}
        assert r["median_ms"]["step"] > 0 and r["median_ms"]["forward"] > 0
        assert r["median_ms"]["append"] > 0 and r["median_ms"]["sample"] > 0
        assert 0 < r["named_share_of_step"] <= 1.0  # the phases run inside the step
        assert r["critical_path"] == phases
    lines = report["markdown"].splitlines()
    assert lines[0].endswith("| B=1 | B=4 |")
    assert sum(line.startswith("| schedule | yes |") for line in lines) == 1


def test_host_overhead_times_the_overlapped_loop_on_the_thread_that_waits(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    bench = load_script("host_overhead")
    emit, switch_s = RequestState.emit, sys.getswitchinterval()
    args = ["--batches", "4", "--steps", "3", "--warmup", "1", "--shape", "tiny"]
    args += ["--tokenizer", str(tiny_model_dir), "--out", str(tmp_path / "host.json")]
    args += ["--threads", str(torch.get_num_threads()), "--overlap-steps", "thread"]
    try:
        (run,) = bench.main(args)["batches"]
    finally:
        sys.setswitchinterval(switch_s)  # the thread mode lowers it process-wide
    assert RequestState.emit == emit
    ms = run["median_ms"]
    assert run["loop"] == "thread" and run["steps"] == 3
    # Prepare, forward and sampling ran on the step thread, and were joined to the steps.
    assert ms["forward"] > 0 and ms["sample"] > 0 and ms["prepare"] > 0 and ms["wait"] > 0
    assert ms["append"] > 0 and ms["resolve"] > 0 and ms["device_idle"] > 0
    # The caller schedules the next step before it waits (`overlap.py`): only the step
    # thread's own preparation and its idle time are host work on its path.
    assert run["critical_path"] == ["prepare", "forward", "sample", "device_idle"]
    assert run["host_ms"] > 0
    assert "| output: RequestState.append / emit | no |" in bench.markdown({"batches": [run]})
    assert "| schedule | no |" in bench.markdown({"batches": [run]})


def test_host_overhead_times_cpu_with_the_thread_clock(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    bench = load_script("host_overhead")
    args = ["--batches", "4", "--steps", "3", "--warmup", "1", "--shape", "tiny"]
    args += ["--tokenizer", str(tiny_model_dir), "--out", str(tmp_path / "host.json")]
    args += ["--threads", str(torch.get_num_threads()), "--clock", "thread"]
    (run,) = bench.main([*args, "--overlap-steps", "async"])["batches"]
    assert run["loop"] == "async" and run["steps"] == 3
    ms = run["median_ms"]
    assert ms["resolve"] > 0 and ms["append"] > 0 and ms["schedule"] > 0
    assert 0 < run["named_share_of_step"] <= 1.0  # the phases' CPU time inside the step's
    with pytest.raises(SystemExit, match="thread loop"):
        bench.main([*args, "--overlap-steps", "thread"])


def test_host_overhead_coarse_leaves_the_per_request_wrappers_out(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """``--coarse``: emit and detokenizing are not wrapped (two clock reads a row each), so
    their time is in ``other`` and the host total is the step's own."""
    bench = load_script("host_overhead")
    args = ["--batches", "4", "--steps", "3", "--warmup", "1", "--shape", "tiny", "--coarse"]
    args += ["--tokenizer", str(tiny_model_dir), "--out", str(tmp_path / "host.json")]
    args += ["--threads", str(torch.get_num_threads()), "--overlap-steps", "async"]
    (run,) = bench.main(args)["batches"]
    ms = run["median_ms"]
    assert ms["append"] == ms["detokenize"] == 0.0  # never timed
    assert ms["schedule"] > 0 and ms["resolve"] > 0 and ms["other"] > 0
    assert 0 < run["host_ms"] < ms["step"]


def test_stub_device_runs_the_engines_host_on_fixed_answers(tiny_model_dir: Path) -> None:
    """`host_stub.py`: the layers and the sampler are replaced, the rest of the step is the
    engine's own: each row gets the next id of the cycle, in order, and is detokenized."""
    bench, stub = load_script("host_overhead"), load_script("host_stub")
    threads = torch.get_num_threads()
    engine = bench.decode_batch_engine(tiny_model_dir, 3, 4, 4, threads)[0]
    cycle = [300, 301, 302, 303, 304]
    stub.stub_device_work(engine, cycle)
    # A step that samples nothing (a prompt's first chunk) reads the vocabulary from it.
    assert engine.runner.model.config is engine.model_config
    engine.add_prompt("first", params=SamplingParams(max_tokens=1), prompt_token_ids=[5, 6])
    assert [(out.request_id, out.new_token_ids) for out in engine.step()] == [("first", (300,))]
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    for i in range(3):
        engine.add_prompt(f"r{i}", params=params, prompt_token_ids=[5, 6, 7, 8])
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(3)}
    text = dict.fromkeys(tokens, "")
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
            text[out.request_id] += out.text_delta
    # The sampler's call s gives row i cycle[(s + i) % 5]; the first request's was call 0.
    assert tokens == {f"r{i}": [cycle[(1 + s + i) % 5] for s in range(3)] for i in range(3)}
    assert text["r0"] == engine.tokenizer.decode([301, 302, 303])
    assert engine.block_manager.num_free_blocks == engine.runner.num_blocks  # all freed


@pytest.mark.parametrize("loop", ["async", "thread"])
def test_stub_device_runs_the_overlapped_loops_as_the_plain_one(
    tiny_model_dir: Path, loop: str
) -> None:
    """The stub replaces the parts the overlapped loops' launcher uses too: the same ids per
    sampler call, so the same tokens and text as the plain loop; with a stub device, too."""
    bench, stub = load_script("host_overhead"), load_script("host_stub")
    switch_s = sys.getswitchinterval()
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    cycle = [300, 301, 302, 303, 304, 305, 306]
    got = {}
    try:
        for mode, device_s in (("off", 0.0), (loop, 0.0), (loop, 0.002)):
            engine = bench.decode_batch_engine(tiny_model_dir, 3, 4, 4, 1, overlap_steps=mode)[0]
            device = stub.stub_device_work(engine, cycle, device_s)
            assert (device is None) == (device_s == 0)
            for i in range(3):
                engine.add_prompt(f"r{i}", params=params, prompt_token_ids=[5, 6, 7, 8])
            got[mode, device_s] = _collect(engine)
    finally:
        sys.setswitchinterval(switch_s)
    assert got["off", 0.0] == got[loop, 0.0] == got[loop, 0.002]
    assert all(len(ids) == 4 for ids, _ in got["off", 0.0].values())


def _collect(engine: Any) -> dict[str, tuple[list[int], str]]:
    ids: dict[str, list[int]] = {}
    text: dict[str, str] = {}
    while engine.has_unfinished():
        for out in engine.step():
            ids.setdefault(out.request_id, []).extend(out.new_token_ids)
            text[out.request_id] = text.get(out.request_id, "") + out.text_delta
    return {rid: (ids[rid], text[rid]) for rid in ids}


def test_stub_device_runs_steps_one_after_another_and_counts_its_idle_time() -> None:
    stub = load_script("host_stub")
    device = stub.StubDevice(0.004)
    device.launch()
    first_end = device.free_at
    device.launch()  # queued behind the first: starts when it ends, no idle time between
    assert device.free_at == pytest.approx(first_end + 0.004)
    assert device.take_idle() == 0.0
    device.wait(device.free_at)
    assert time.perf_counter() >= device.free_at
    time.sleep(0.02)
    device.launch()  # the device sat idle from the second step's end until now
    assert device.take_idle() >= 0.02
    assert device.take_idle() == 0.0  # taken once
    ids = stub.FixedIds([7, 8], device)(torch.zeros(3, 5), [None] * 3)
    assert ids.done_at == device.free_at
    assert ids.tolist() == [7, 8, 7] and time.perf_counter() >= device.free_at


def test_host_overhead_device_ms_reports_the_stub_devices_idle_time(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """With ``--device-ms`` the host on the critical path is the stub device's idle time: in
    the plain loop the device waits for all of the host's work after each step; in the async
    loop the calls take no less than the device's steps, which run one after another."""
    bench = load_script("host_overhead")
    args = ["--batches", "4", "--steps", "4", "--warmup", "1", "--shape", "tiny", "--coarse"]
    args += ["--tokenizer", str(tiny_model_dir), "--out", str(tmp_path / "host.json")]
    args += ["--threads", str(torch.get_num_threads()), "--stub-device", "--device-ms", "3"]
    (plain,) = bench.main([*args, "--overlap-steps", "off"])["batches"]
    (overlapped,) = bench.main([*args, "--overlap-steps", "async"])["batches"]
    assert plain["host_ms"] == plain["median_ms"]["device_idle"] > 0
    assert overlapped["host_ms"] == overlapped["median_ms"]["device_idle"]
    # Consecutive calls span the device's steps, which run back to back, D each.
    assert sum(overlapped["step_ms_all"]) >= (len(overlapped["step_ms_all"]) - 1) * 3.0
    with pytest.raises(SystemExit, match="--stub-device --clock wall"):
        bench.main([*args, "--clock", "thread"])
