"""`ops/bench/peers/`: the workload file, result lines and missing peers, without the peer venvs.

The vLLM smoke test runs only where `bash ops/bench/peers/setup_vllm.sh` built .venv-vllm (CI
does not: a 3.5 GB environment); elsewhere it is skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_PEERS = ROOT / "ops" / "bench" / "peers" / "run_peers.py"


@pytest.fixture(scope="module")
def peers() -> ModuleType:
    name = "paternoster_run_peers"
    spec = importlib.util.spec_from_file_location(name, RUN_PEERS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_workload_json_round_trip(peers: ModuleType, tmp_path: Path) -> None:
    bench = peers.load_engine_bench()
    workload = bench.make_workload(7, 3, 0.05, list(range(100, 900)))
    path = tmp_path / "w.json"
    peers.write_workload(path, workload)
    records = peers.read_workload(path)
    assert [r["request_id"] for r in records] == [r.request_id for r in workload]
    for rec, req in zip(records, workload, strict=True):
        assert rec["prompt_token_ids"] == list(req.prompt_ids)
        assert rec["max_tokens"] == req.output_len >= 1
        assert rec["kind"] == req.kind
    assert json.loads(path.read_text()) == records


def test_parse_result_line(peers: ModuleType) -> None:
    first = {"system": "a", "output_tok_s": 1.5}
    last = {"system": "b", "output_tok_s": 2.5, "outputs": {"r0": [1, 2]}}
    text = "\n".join(
        [
            "INFO 11-29 [core.py:1] starting",
            "PEER_RESULT " + json.dumps(first),
            "(EngineCore pid=1) PEER_RESULT not at the start: ignored",
            "PEER_RESULT " + json.dumps(last),
            "INFO shutdown",
        ]
    )
    assert peers.parse_result_line(text) == last
    assert peers.parse_result_line("INFO nothing here\n") is None


def test_parity_counts_first_divergence(peers: ModuleType) -> None:
    ours = {"outputs": {"r0": [1, 2, 3], "r1": [4, 5, 6]}}
    peer = {"outputs": {"r0": [1, 2, 3], "r1": [4, 9, 6]}}
    assert peers.parity(ours, peer, ["r0", "r1"]) == {
        "checked": 2,
        "equal": 1,
        "first_diff_at": {"r1": 1},
        "skipped": [],
    }
    # An output the peer's stream could not give in full is not read as a divergence.
    peer["incomplete_outputs"] = ["r1"]
    assert peers.parity(ours, peer, ["r0", "r1"]) == {
        "checked": 1,
        "equal": 1,
        "first_diff_at": {},
        "skipped": ["r1"],
    }


def test_missing_peer_is_not_installed(peers: ModuleType, tmp_path: Path) -> None:
    args = argparse.Namespace(venv_root=tmp_path, threads=2, peer_timeout_s=5.0)

    def never(*_: object) -> list[str]:
        raise AssertionError("a missing peer must not be started")

    result = peers.run_peer(peers.PEERS["vllm-bind"], args, tmp_path / "w.json", never)
    assert result["status"] == "not installed"
    assert result["setup"] == "bash ops/bench/peers/setup_vllm.sh"
    # A venv without the built llama-server binary is not installed either.
    (tmp_path / ".venv-llamacpp" / "bin").mkdir(parents=True)
    (tmp_path / ".venv-llamacpp" / "bin" / "python").touch()
    result = peers.run_peer(peers.PEERS["llama.cpp-f32"], args, tmp_path / "w.json", never)
    assert result["status"] == "not installed"


def test_main_reports_missing_peers(
    peers: ModuleType, tmp_path: Path, smol_model_dir: Path
) -> None:
    out = tmp_path / "peers.json"
    argv = ["--no-ours", "--peers", "vllm-bind,vllm-nobind,llama.cpp-f32"]
    argv += ["--venv-root", str(tmp_path), "--num-requests", "3", "--scale", "0.05"]
    report = peers.main([*argv, "--threads", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    assert {s["status"] for s in report["systems"].values()} == {"not installed"}
    assert set(report["systems"]) == {"vllm-bind", "vllm-nobind", "llama.cpp-f32"}
    assert len(peers.read_workload(out.with_suffix(".workload.json"))) == 3


def test_report_is_written_after_each_system(
    peers: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run stopped part way keeps the systems it finished, marked partial."""
    out = tmp_path / "peers.json"
    argv = ["--no-ours", "--peers", "vllm-bind,llama.cpp-f32", "--venv-root", str(tmp_path)]
    argv += ["--num-requests", "3", "--scale", "0.05", "--threads", "1", "--out", str(out)]
    run_peer = peers.run_peer

    def stop_at_llamacpp(peer: Any, *args: Any) -> dict[str, Any]:
        if peer.name == "llama.cpp-f32":
            raise KeyboardInterrupt
        return run_peer(peer, *args)

    monkeypatch.setattr(peers, "run_peer", stop_at_llamacpp)
    with pytest.raises(KeyboardInterrupt):
        peers.main(argv)
    kept = json.loads(out.read_text())
    assert kept["partial"] is True
    assert set(kept["systems"]) == {"vllm-bind"}
    monkeypatch.setattr(peers, "run_peer", run_peer)
    assert peers.main(argv)["partial"] is False
    assert json.loads(out.read_text())["partial"] is False


def test_local_systems_run_beside_ours(peers: ModuleType, tmp_path: Path) -> None:
    """HF continuous batching runs in-process on the same requests and is compared with ours."""
    out = tmp_path / "peers.json"
    argv = ["--peers", "", "--local", "hf-cb", "--num-requests", "3", "--scale", "0.05"]
    report = peers.main([*argv, "--threads", "1", "--out", str(out)])
    ours, hf = report["systems"]["ours"], report["systems"]["hf-cb"]
    assert ours["status"] == hf["status"] == "ok"
    assert ours["output_tokens"] == hf["output_tokens"] > 0
    assert hf["ours_speedup"] == ours["output_tok_s"] / hf["output_tok_s"]
    with pytest.raises(SystemExit):
        peers.parse_args(["--local", "hf-nonsense"])


@pytest.mark.slow
def test_vllm_cpu_smoke(peers: ModuleType, tmp_path: Path) -> None:
    if not (ROOT / ".venv-vllm" / "bin" / "python").exists():
        pytest.skip(".venv-vllm absent: bash ops/bench/peers/setup_vllm.sh builds it")
    workload = [
        {"request_id": f"r{i}", "prompt_token_ids": list(range(1000 + i, 1012)), "max_tokens": n}
        for i, n in enumerate((3, 5))
    ]
    path = tmp_path / "w.json"
    path.write_text(json.dumps(workload))
    args = argparse.Namespace(
        venv_root=ROOT, threads=2, peer_timeout_s=600.0, vllm_dtype="float32", llamacpp_gguf=None
    )
    result = peers.run_peer(peers.PEERS["vllm-bind"], args, path)
    assert result["status"] == "ok", result
    assert result["lengths_ok"] and result["output_tokens"] == 8
    assert [len(result["outputs"][r]) for r in ("r0", "r1")] == [3, 5]


def test_rounds_time_ours_again_and_record_load(peers: ModuleType, tmp_path: Path) -> None:
    """``--rounds 2`` times ours twice on the same requests; each system carries its load."""
    argv = ["--peers", "", "--rounds", "2", "--num-requests", "3", "--scale", "0.05"]
    report = peers.main([*argv, "--threads", "1"])
    ours = report["systems"]["ours"]
    assert ours["rounds"][0]["output_tok_s"] == ours["output_tok_s"]
    assert len(ours["rounds"]) == 2 and all(r["wall_s"] > 0 for r in ours["rounds"])
    before, after = ours["loadavg_before_after"]
    assert len(before) == len(after) == 3


def test_vllm_default_is_auto_bind_with_compile(
    peers: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM as it ships: its own thread binding and torch.compile; ``vllm-bind`` stays eager."""
    import export_hf  # on sys.path once run_peers is loaded

    monkeypatch.setattr(export_hf, "export", lambda dtype: tmp_path / f"hf-{dtype}")
    args = argparse.Namespace(threads=2, vllm_dtype="float32", rounds=2)

    def argv_of(name: str) -> list[str]:
        return peers.peer_args(peers.PEERS[name], args, tmp_path / "w.json")

    default, bound = argv_of("vllm-default"), argv_of("vllm-bind")
    assert default[default.index("--bind") + 1] == "auto" and "--compile" in default
    assert bound[bound.index("--bind") + 1] == "0-1" and "--compile" not in bound
    assert default[default.index("--rounds") + 1] == "2"


def test_llamacpp_gets_the_rounds(
    peers: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama.cpp runs ``--rounds`` after one start-up, as vLLM does; before 2026-12-07 it ran
    once whatever the count, so its column had one round where the others had two."""
    args = argparse.Namespace(threads=2, rounds=2, venv_root=tmp_path, llamacpp_no_repack=False)
    argv = peers.peer_args(peers.PEERS["llama.cpp-q4_1"], args, tmp_path / "w.json")
    assert argv[argv.index("--rounds") + 1] == "2" and "--no-repack" not in argv


def test_vllm_auto_dtype_runs_vllms_own_choice_on_the_float32_export(
    peers: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--vllm-dtype auto`` (the default): vLLM picks the dtype, from the float32 export."""
    import export_hf

    monkeypatch.setattr(export_hf, "export", lambda dtype: tmp_path / f"hf-{dtype}")
    assert peers.parse_args([]).vllm_dtype == "auto"
    for dtype, export in (("auto", "float32"), ("bfloat16", "bfloat16")):
        args = argparse.Namespace(threads=2, vllm_dtype=dtype, rounds=1)
        argv = peers.peer_args(peers.PEERS["vllm-compile"], args, tmp_path / "w.json")
        assert argv[argv.index("--dtype") + 1] == dtype
        assert argv[argv.index("--model") + 1] == str(tmp_path / f"hf-{export}")


def test_llamacpp_gguf_runs_the_named_file(peers: ModuleType, tmp_path: Path) -> None:
    """``llama.cpp-gguf`` serves ``--gguf``'s file (the Q8_0 or Q4_0 one ours then loads too),
    and the bundled file without it; ``llama.cpp-q4_1`` keeps the bundled file either way."""
    from worker.models.loader import bundled_model_path

    named = tmp_path / "m.gguf"
    for gguf, want in ((named, named), (None, bundled_model_path())):
        args = argparse.Namespace(
            threads=2, rounds=1, venv_root=tmp_path, llamacpp_no_repack=False, gguf=gguf
        )
        argv = peers.peer_args(peers.PEERS["llama.cpp-gguf"], args, tmp_path / "w.json")
        assert argv[argv.index("--gguf") + 1] == str(want)
        native = peers.peer_args(peers.PEERS["llama.cpp-q4_1"], args, tmp_path / "w.json")
        assert native[native.index("--gguf") + 1] == str(bundled_model_path())
