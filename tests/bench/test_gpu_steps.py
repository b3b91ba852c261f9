"""The H200 lease's new parts on the CPU at tiny sizes: Qwen3-shaped random weights, nano-vllm's
workload, and `gpu_steps.py` (decode steps against their byte floor, idle share). The report's
structure is checked, never its timings."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch

from tests.bench.scripts import load_script
from worker.models.config import ModelConfig
from worker.models.loader import load_model


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("random-qwen3")
    random_model = load_script("random_model")
    return random_model.write_random_model("tiny-qwen3", tiny_model_dir, out, torch.float32, "cpu")


def test_random_qwen3_loads_in_ours_and_in_transformers(qwen3_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    mc = ModelConfig.from_dir(qwen3_dir)
    assert mc.model_type == "qwen3" and mc.qk_norm and mc.tie_word_embeddings
    assert mc.head_size == 32 != mc.hidden_size // mc.num_q_heads
    hf = AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen3ForCausalLM"
    ours = load_model(qwen3_dir, torch.float32, torch.device("cpu"))
    assert ours.lm_head.weight is ours.embed_tokens.weight
    params = dict(ours.named_parameters())
    for name, tensor in hf.state_dict().items():  # every HF weight landed in ours, q/k norms too
        target = ours.weight_target(name)
        if target is None:  # the tied LM head
            continue
        ours_name, start, end = target
        rows = params[ours_name] if end < 0 else params[ours_name][start:end]
        torch.testing.assert_close(rows, tensor, rtol=0, atol=0)
    assert sum("q_norm" in n or "k_norm" in n for n in params) == 2 * mc.num_layers


def test_qwen3_0_6b_shape_and_its_byte_floor() -> None:
    random_model = load_script("random_model")
    step_floor = load_script("step_floor")
    config = random_model.hf_config("qwen3-0.6b", {"vocab_size": 49152}, torch.bfloat16)
    mc = ModelConfig.from_hf(config.to_dict())
    assert (mc.model_type, mc.num_layers, mc.hidden_size, mc.intermediate_size) == (
        "qwen3",
        28,
        1024,
        3072,
    )
    assert (mc.num_q_heads, mc.num_kv_heads, mc.head_size, mc.vocab_size) == (16, 8, 128, 151936)
    assert mc.qk_norm and mc.tie_word_embeddings and mc.rope.theta == 1e6
    nbytes = step_floor.step_bytes(mc, 2, batch=4, context=99.0)
    # Qwen3-0.6B is 0.60 B weights (0.44 B in the layers, 0.16 B the tied table): 1.2 GB in bf16.
    assert 1.18e9 < nbytes["weights"] < 1.21e9
    per_token = 2 * 28 * 8 * 128 * 2  # K and V, 28 layers, 8 heads of 128, bf16
    assert nbytes["kv_read"] == 4 * 100 * per_token and nbytes["kv_write"] == 4 * per_token
    assert nbytes["total"] == nbytes["weights"] + nbytes["kv_read"] + nbytes["kv_write"]


def test_busy_time_is_a_union_clipped_to_the_window() -> None:
    step_floor = load_script("step_floor")
    spans = [(0.0, 10.0), (5.0, 8.0), (8.0, 12.0), (20.0, 30.0), (-5.0, 1.0), (90.0, 120.0)]
    assert step_floor.busy_us(spans, (0.0, 100.0)) == 12.0 + 10.0 + 10.0
    assert step_floor.busy_us([], (0.0, 1.0)) == 0.0
    trace = {
        "traceEvents": [
            {"ph": "X", "cat": "user_annotation", "name": "gpu_steps.window", "ts": 100, "dur": 50},
            {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 110, "dur": 10},
            {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 115, "dur": 10},
            {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "ts": 140, "dur": 5},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 100, "dur": 50},
            {"ph": "M", "name": "process_name"},
        ]
    }
    idle = step_floor.idle_from_trace(trace, "cuda", wall_us=1e6)  # the annotation wins
    assert idle["busy_ms"] == pytest.approx(0.020) and idle["idle_share"] == pytest.approx(0.6)
    assert idle["device_events"] == 3 and idle["top_events_ms"]["gemm"] == pytest.approx(0.020)
    assert step_floor.idle_from_trace(trace, "cpu", wall_us=1e6)["idle_share"] == 0.0
    # A CUDA-only trace has no annotation: the window is the wall clock from the first kernel.
    gpu_only = {"traceEvents": trace["traceEvents"][1:4]}
    idle = step_floor.idle_from_trace(gpu_only, "cuda", wall_us=80.0)
    assert idle["window_ms"] == pytest.approx(0.080) and idle["idle_share"] == pytest.approx(0.75)
    assert step_floor.idle_from_trace({"traceEvents": []}, "cuda", 5.0)["idle_share"] is None


@pytest.fixture(scope="module")
def cpu_reports(tmp_path_factory: pytest.TempPathFactory, qwen3_dir: Path) -> Path:
    """gpu_check.sh's new engine parts, CPU-sized, their JSON in one directory as in $OUT."""
    out = tmp_path_factory.mktemp("gpu-out")
    args = ["--model", str(qwen3_dir), "--batch-sizes", "1,3", "--context", "9", "--steps", "2"]
    args += ["--warmup", "1", "--profile-steps", "1", "--max-num-batched-tokens", "16"]
    args += ["--phase-steps", "3", "--host-profile-steps", "2"]
    args += ["--kv-cache-bytes", str(16 << 20), "--out", str(out / "steps_qwen3.json")]
    load_script("gpu_steps").main(args)
    args = ["--model", str(qwen3_dir), "--workload", "nano-vllm", "--systems", "ours"]
    args += ["--num-requests", "3", "--scale", "0.02", "--kv-cache-bytes", str(16 << 20)]
    args += ["--threads", str(torch.get_num_threads()), "--out", str(out / "nano_qwen3.json")]
    load_script("engine").main(args)
    return out


def test_gpu_steps_on_the_cpu(cpu_reports: Path) -> None:
    report = json.loads((cpu_reports / "steps_qwen3.json").read_text())
    assert report["model"]["model_type"] == "qwen3" and report["model"]["qk_norm"]
    assert report["copy_gbps"] > 0 and report["weight_bytes"] > 0
    assert report["steps"] == {"warmup": 1, "timed": 2, "profiled": 1}
    assert [r["batch"] for r in report["batches"]] == [1, 3]
    for r in report["batches"]:
        assert r["decode_only"], r  # every measured step was a decode of exactly B rows
        assert r["prefill_steps"] == (1 if r["batch"] == 1 else 2)  # 27 tokens, 16 a step
        assert r["context_mean"] >= 9 + 1
        assert r["ms_per_step"] > 0 and r["floor_ms"] > 0 and r["x_floor"] > 0
        assert r["bytes"]["kv_read"] > 0 and r["output_tok_s"] > 0
        assert r["profiled_steps"] == 1 and 0.0 <= r["idle_share"] <= 1.0, r
        assert r["device_events"] > 0 and r["top_events_ms"]
        phases = r["phase_ms"]  # the host's side of the same steps, timed from outside
        assert 0 < phases["host"] <= phases["step"] and phases["schedule"] > 0, phases
        assert phases["append"] > 0 and phases["run"] >= phases["prepare"] > 0, phases
    # A cProfile of the largest batch's steps, one line a function, by own time.
    assert "host_profile" not in report["batches"][0]
    profile = report["batches"][1]["host_profile"]
    assert 0 < len(profile) <= 25 and all(" ms own " in line for line in profile), profile


def test_nano_vllm_workload(cpu_reports: Path) -> None:
    bench = load_script("engine")
    workload = bench.make_workload(256, 0, 1.0, range(100, 900), bench.WORKLOADS["nano-vllm"])
    prompt_lens = [len(r.prompt_ids) for r in workload]
    output_lens = [r.output_len for r in workload]
    assert len(workload) == 256 and {r.kind for r in workload} == {"nano-vllm"}
    for lens in (prompt_lens, output_lens):
        assert 100 <= min(lens) and max(lens) <= 1024
        assert abs(statistics.mean(lens) - 562) < 15  # uniform: E = (100 + 1024) / 2
    report = json.loads((cpu_reports / "nano_qwen3.json").read_text())
    assert report["classes"] == [
        {"name": "nano-vllm", "prompt_len": [100, 1024], "output_len": [100, 1024], "weight": 1.0}
    ]
    assert report["workload"]["requests_per_class"] == {"nano-vllm": 3}
    assert report["systems"]["ours"]["output_tokens"] == report["workload"]["output_tokens"] > 0


def test_summary_digests_every_report(cpu_reports: Path) -> None:
    (cpu_reports / "killed.json").write_text('{"systems": ')  # a part killed mid-write
    lines = load_script("gpu_summary").main([str(cpu_reports)])
    text = "\n".join(lines)
    assert "nano_qwen3: 3 requests (nano-vllm)" in text and "out tok/s" in text
    assert "steps_qwen3: qwen3 2 layers" in text
    assert sum("batch " in line and "floor" in line for line in lines) == 2
    assert sum(line.startswith("    host ") and "schedule" in line for line in lines) == 2
    assert "killed.json: unreadable" in text


def test_random_fp8_checkpoint_loads_as_our_fp8_path_reads_it(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """``random_model.py --fp8``: every decoder projection as e4m3 codes with a scale a row
    (compressed-tensors), which the loader keeps as FP8 (`Fp8Checkpoint`) and, on the CPU,
    dequantizes exactly; the embeddings stay float."""
    from safetensors.torch import load_file

    from worker.models.quant_fp8 import FP8, Fp8Checkpoint

    random_model = load_script("random_model")
    out = random_model.write_random_model("tiny", tiny_model_dir, tmp_path, torch.float32, "cpu")
    floats = load_file(str(out / "model.safetensors"))
    assert random_model.to_fp8(out) == 2 * 7  # q, k, v, o, gate, up, down in 2 layers
    state = load_file(str(out / "model.safetensors"))
    assert state["model.embed_tokens.weight"].dtype == torch.float32
    checkpoint = Fp8Checkpoint.of(out)
    assert checkpoint is not None and len(checkpoint.scales) == 14
    model = load_model(out, torch.float32, torch.device("cpu"))
    ours = model.layers[1].mlp.down_proj.weight.detach()  # type: ignore[union-attr, index]
    codes, scale = (
        state["model.layers.1.mlp.down_proj.weight"],
        checkpoint.scales["model.layers.1.mlp.down_proj.weight"],
    )
    assert codes.dtype == FP8 and scale.shape == (codes.shape[0], 1)
    assert torch.equal(ours, codes.float() * scale)
    original = floats["model.layers.1.mlp.down_proj.weight"]
    assert 0 < float((ours - original).abs().max()) <= 0.07 * float(original.abs().max())


def test_quant_gpu_reports_each_tile_and_the_digest_reads_it(tmp_path: Path) -> None:
    """``quant_gpu.py --smoke`` (the interpreter, tiny shape): every candidate and the default
    tile timed at each row count, the best named, and gpu_summary.py's digest lists it."""
    quant_gpu = load_script("quant_gpu")
    report = quant_gpu.main(["--smoke", "--rows", "1,33", "--out", str(tmp_path / "q.json")])
    assert [r["rows"] for r in report["results"]] == [1, 33]
    for r in report["results"]:
        assert r["default"] in r["int8_us"] and r["best"] in r["int8_us"]
        assert r["best_us"] == min(r["int8_us"].values()) > 0 and r["e4m3_default_us"] > 0
    assert report["results"][0]["default"] != report["results"][1]["default"]  # 1 vs 33 rows
    digest = load_script("gpu_summary").summarize(tmp_path)
    assert digest[0].startswith("q: us a call") and len(digest) == 3
