"""The job-plane and prefix-cache benchmarks run end to end on the tiny model, so they cannot
silently rot (their numbers come from the bundled model, in BENCHMARKS.md)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from producer.fleet import HEARTBEAT_S
from tests.bench.scripts import load_script as load
from tests.kernels.paged_cases import cpu_has


def test_job_plane_bench_tiny(tmp_path: Path, tiny_model_dir: Path) -> None:
    # The bench uses REDIS_URL (CI: the Redis 7 on 127.0.0.1), else an embedded server.
    bench = load("job_plane")
    args = ["--model", str(tiny_model_dir), "--num-requests", "4", "--scale", "0.05"]
    args += ["--threads", str(torch.get_num_threads()), "--kv-cache-bytes", str(16 << 20)]
    report = bench.main([*args, "--out", str(tmp_path / "out.json")])
    (round_,) = report["rounds"]  # main() raises if the two systems' tokens differ
    assert round_["redis_over_engine"] > 0
    redis_run = round_["redis"]
    assert redis_run["redis_calls"]["xadd"] >= report["workload"]["output_tokens"] > 0
    assert redis_run["redis_commands_per_token"] > 0
    # One round trip per step, plus the heartbeats (one a second, idle or not, from the worker's
    # start: the client's start-up can take over a second) and the goodbye.
    beats = redis_run["worker_wall_s"] / HEARTBEAT_S + 2
    assert redis_run["publish_round_trips"] <= redis_run["steps"] + beats


def test_prefix_cache_bench_tiny(tmp_path: Path, tiny_model_dir: Path) -> None:
    bench = load("prefix_cache")
    args = ["--model", str(tiny_model_dir), "--jobs", "4", "--system-tokens", "40"]
    # A 64-token step budget prefills one ~75-token prompt per step: later jobs find its blocks.
    args += ["--output-tokens", "3", "--threads", str(torch.get_num_threads())]
    args += ["--max-num-seqs", "8", "--max-num-batched-tokens", "64"]
    args += ["--kv-cache-bytes", str(16 << 20), "--out", str(tmp_path / "out.json")]
    report = bench.main(args)
    off, on = report["runs"]["off"], report["runs"]["on"]
    assert on["prompt_tokens_computed"] < off["prompt_tokens_computed"]


def test_cpu_kernels_bench_tiny(tmp_path: Path) -> None:
    """`cpu_kernels.py` checks every kernel against torch before timing it, and reports both."""
    bench = load("cpu_kernels")
    out = tmp_path / "cpu_kernels.json"
    args = ["--tokens", "3", "--contexts", "40", "--layers", "2", "--repeats", "1"]
    report = bench.main([*args, "--calls", "1", "--threads", str(torch.get_num_threads())])
    assert out.exists() is False  # no --out: nothing written
    bench.main([*args, "--calls", "1", "--out", str(out)])
    assert out.exists()
    assert set(report["decode_attention"]) == {"3x40/float32", "3x40/bfloat16"}  # --cache-dtypes
    for attention in report["decode_attention"].values():
        assert attention["ours_us"] > 0 and attention["torch_us"] > 0
        assert attention["ours_kv_gb_s"] > 0
    assert set(report["layer_ops"]) == {
        f"{name}@3" for name in ("rotary", "silu_and_mul", "add_rms_norm", "write_kv")
    }
    for result in report["layer_ops"].values():
        assert result["speedup"] == result["torch_us"] / result["ours_us"] > 0


def test_prefill_attention_bench_tiny(tmp_path: Path) -> None:
    """`prefill_attention.py` checks the reference against the explicit mask before timing,
    for fresh and continued chunks, and reports both times and their ratio; also our C++
    kernels' times and their errors against float32 SDPA."""
    bench = load("prefill_attention")
    out = tmp_path / "prefill_attention.json"
    args = ["--chunks", "40x40", "50x17", "--dtypes", "float32", "bfloat16", "--repeats", "1"]
    report = bench.main([*args, "--threads", str(torch.get_num_threads()), "--out", str(out)])
    assert out.exists()
    assert set(report["chunks"]) == {
        f"{c}/{d}" for c in ("40x40", "50x17") for d in ("float32", "bfloat16")
    }
    for r in report["chunks"].values():
        assert r["masked_over_reference"] == r["masked_ms"] / r["reference_ms"] > 0
    # Our kernels run where the build has their instructions (cpu_prefill_attention.cpp, also
    # "widened" over a bf16 cache: AVX-512; cpu_prefill_bf16.cpp: AVX-512 BF16, which every AMX
    # CPU has too); elsewhere they decline and go untimed.
    kernels = (
        ("float32", "kernel", "avx512f", 1e-5),
        ("bfloat16", "kernel", "avx512_bf16", 1e-2),
        ("bfloat16", "dots", "avx512_bf16", 1e-2),
        ("bfloat16", "widened", "avx512f", 1e-5),
    )
    for dtype, name, flag, tolerance in kernels:
        for chunk in ("40x40", "50x17"):
            r = report["chunks"][f"{chunk}/{dtype}"]
            assert (f"{name}_ms" in r) == cpu_has(flag)
            if f"{name}_ms" in r:
                assert r[f"{name}_ms"] > 0
                assert 0 <= r[f"{name}_rel_err"] < tolerance
            if name == "kernel" and "kernel_ms" in r:
                assert r["reference_over_kernel"] == r["reference_ms"] / r["kernel_ms"] > 0


def test_cpu_linear_bench_tiny(tmp_path: Path) -> None:
    bench = load("cpu_linear")
    out = tmp_path / "cpu_linear.json"
    args = ["--rows", "1", "3", "--layers", "1", "--repeats", "1", "--out", str(out)]
    report = bench.main([*args, "--threads", str(torch.get_num_threads())])
    assert report["weight_bytes"] == 4 * (576 * 960 + 576 * 576 + 576 * 3072 + 1536 * 576)
    assert set(report["rows"]) == {1, 3}
    for result in report["rows"].values():
        assert result["onednn_ms"] > 0 and result["torch_ms"] > 0
        assert result["onednn_gflop_s"] > 0 and result["onednn_weight_gb_s"] > 0
    assert out.exists()


def test_step_rows_bench_tiny(tmp_path: Path, tiny_model_dir: Path) -> None:
    bench = load("step_rows")
    out = tmp_path / "rows.json"
    args = ["--model", str(tiny_model_dir), "--rows", "1", "3", "--prompt-tokens", "2", "5"]
    args += ["--repeats", "1", "--threads", str(torch.get_num_threads()), "--out", str(out)]
    report = bench.main(args)
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert set(report["decode_ms"]) == set(report["decode_and_7_token_prompt_ms"]) == {1, 3}
    assert set(report["prompt_alone_ms"]) == {2, 5}
    assert all(ms > 0 for ms in report["decode_ms"].values())


def test_quant_linear_bench_picks_systems_and_clock(tmp_path: Path) -> None:
    bench = load("quant_linear")
    out = tmp_path / "quant_linear.json"
    systems = ["q4_1", "q4_1_deq", "q4_1@float32"]
    args = ["--rows", "1", "20", "--layers", "2", "--repeats", "1", "--clock", "wall"]
    report = bench.main([*args, "--systems", *systems, "--out", str(out)])
    assert report["clock"] == "wall"
    assert set(report["rows"]) == {1, 20}
    for result in report["rows"].values():
        assert list(result) == systems and all(ms > 0 for ms in result.values())
    assert json.loads(out.read_text())["clock"] == "wall"
