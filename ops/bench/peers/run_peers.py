"""Our engine against vLLM (CPU) and llama.cpp's server on engine.py's seeded workload.

    python ops/bench/peers/run_peers.py --num-requests 4 --scale 0.1      # smoke: ~3 min, 2 cores
    python ops/bench/peers/run_peers.py --out ops/bench/results/peers.json  # the full 64-job mix

Each peer lives in its own virtual environment at the repository root (built by
``setup_vllm.sh`` / ``setup_llamacpp.sh``) and runs as a subprocess with that venv's python on a
workload JSON written here; it prints one ``PEER_RESULT {json}`` line. A peer whose venv is absent
is reported as "not installed", not as a failure. ``ours`` (engine.py's ``run_ours``, fp32, same
threads) runs in this process on the same requests, as do the Hugging Face systems named in
``--local`` (``hf-cb``: continuous batching, ``hf-static``: ``generate`` on static batches); the
table shows every system's output tok/s and ``ours x`` = ours' output tok/s over the system's.

Peers:
- ``vllm-bind``: vLLM's offline ``LLM.generate``, OpenMP threads pinned to cores 0..threads-1.
- ``vllm-nobind``: the same with ``VLLM_CPU_OMP_THREADS_BIND=nobind``.
- ``vllm-compile``: ``vllm-bind`` with torch.compile allowed (vLLM's default outside our eager
  runs; its start-up compiles the model's graphs, excluded from the timing as all start-ups).
- ``llama.cpp-f32``: ``llama-server`` with parallel slots on an F32 GGUF made from the bundled one
  by ``llama-quantize``: the same dequantized fp32 weights that ours and vLLM load.
- ``llama.cpp-q4_1``: the same server on the bundled Q4_1 GGUF itself, llama.cpp's native case
  (4-bit weights: less arithmetic and memory traffic per token than the fp32 systems do).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from subprocess import PIPE
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
PEERS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))  # `worker` without an install, as engine.py does
sys.path.insert(0, str(PEERS_DIR))

RESULT_PREFIX = "PEER_RESULT "


def load_engine_bench() -> ModuleType:
    """ops/bench/engine.py as a module (it is a script, not a package member)."""
    name = "paternoster_bench_engine"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "ops" / "bench" / "engine.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


# -- workload file and result lines ----------------------------------------------------------------


def workload_records(workload: Sequence[Any]) -> list[dict[str, Any]]:
    return [
        {
            "request_id": r.request_id,
            "kind": r.kind,
            "prompt_token_ids": list(r.prompt_ids),
            "max_tokens": r.output_len,
        }
        for r in workload
    ]


def write_workload(path: Path, workload: Sequence[Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(workload_records(workload)))


def read_workload(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text()))


def parse_result_line(text: str) -> dict[str, Any] | None:
    """The last ``PEER_RESULT {json}`` line of a peer's stdout, or None if there is none."""
    for line in reversed(text.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return dict(json.loads(line[len(RESULT_PREFIX) :]))
    return None


# -- peers -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Peer:
    name: str
    venv: str  # directory name at the venv root
    setup: str  # the script that builds the venv
    script: str  # run with the venv's python
    needs: str = ""  # a further file under the venv that must exist (a built binary)


LLAMA_SERVER_BIN = "llama-server/bin/llama-server"  # under .venv-llamacpp
PEERS = {
    "vllm-bind": Peer("vllm-bind", ".venv-vllm", "setup_vllm.sh", "vllm_cpu.py"),
    "vllm-nobind": Peer("vllm-nobind", ".venv-vllm", "setup_vllm.sh", "vllm_cpu.py"),
    "vllm-compile": Peer("vllm-compile", ".venv-vllm", "setup_vllm.sh", "vllm_cpu.py"),
    **{
        name: Peer(
            name, ".venv-llamacpp", "setup_llamacpp.sh", "llamacpp.py", needs=LLAMA_SERVER_BIN
        )
        for name in ("llama.cpp-f32", "llama.cpp-q4_1")
    },
}
DEFAULT_PEERS = "vllm-bind,vllm-nobind,llama.cpp-f32,llama.cpp-q4_1"
LOCAL_SYSTEMS = {"ours-bf16", "hf-cb", "hf-static"}  # engine.py's, run in this process


def peer_python(peer: Peer, venv_root: Path) -> Path | None:
    """The venv's python, or None when the peer is not installed."""
    venv = venv_root / peer.venv
    python = venv / "bin" / "python"
    if not python.exists() or (peer.needs and not (venv / peer.needs).exists()):
        return None
    return python


def peer_args(peer: Peer, args: argparse.Namespace, workload_path: Path) -> list[str]:
    """The peer script's arguments; exports the HF directory for vLLM on first use."""
    common = ["--workload", str(workload_path), "--label", peer.name]
    if peer.name.startswith("vllm"):
        from export_hf import export

        bind = "nobind" if peer.name == "vllm-nobind" else f"0-{args.threads - 1}"
        model = export(dtype=args.vllm_dtype)
        compile_ = ["--compile"] if peer.name == "vllm-compile" else []
        return [
            *common,
            "--model",
            str(model),
            "--bind",
            bind,
            "--dtype",
            args.vllm_dtype,
            *compile_,
        ]
    from export_hf import export_gguf_f32

    from worker.models.loader import bundled_model_path

    gguf = bundled_model_path()  # Q4_1
    if peer.name == "llama.cpp-f32":
        bins = args.venv_root / peer.venv / Path(LLAMA_SERVER_BIN).parent
        gguf = export_gguf_f32(bins / "llama-quantize", gguf)
    server = args.venv_root / peer.venv / LLAMA_SERVER_BIN
    return [*common, "--gguf", str(gguf), "--server", str(server), "--threads", str(args.threads)]


def run_peer(
    peer: Peer,
    args: argparse.Namespace,
    workload_path: Path,
    build_args: Callable[[Peer, argparse.Namespace, Path], list[str]] = peer_args,
) -> dict[str, Any]:
    python = peer_python(peer, args.venv_root)
    if python is None:
        return {
            "status": "not installed",
            "setup": f"bash ops/bench/peers/{peer.setup}",
            "venv": str(args.venv_root / peer.venv),
        }
    command = [str(python), str(PEERS_DIR / peer.script), *build_args(peer, args, workload_path)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    start = time.perf_counter()
    # A session of its own: on timeout the whole group goes (vLLM's engine and worker processes,
    # llama-server), not only the script.
    proc = subprocess.Popen(
        command, stdout=PIPE, stderr=PIPE, text=True, env=env, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=args.peer_timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"status": "failed", "reason": f"timeout after {args.peer_timeout_s} s"}
    except BaseException:  # Ctrl-C, or SIGTERM (main turns it into SystemExit): no orphans
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    result = parse_result_line(stdout)
    if proc.returncode != 0 or result is None:
        tail = (stdout + stderr)[-3000:]
        return {"status": "failed", "returncode": proc.returncode, "log_tail": tail}
    result["status"] = "ok"
    result["process_s"] = time.perf_counter() - start
    return result


# -- ours, comparison, table -----------------------------------------------------------------------


def run_local(
    bench: ModuleType, args: argparse.Namespace, workload: Sequence[Any], name: str
) -> dict[str, Any]:
    """engine.py's system ``name`` (``ours``, ``hf-cb``, ``hf-static``) in this process, on the
    same requests and threads, on a fresh thread as there."""
    import functools
    import gc

    bench_args = bench.parse_args(["--threads", str(args.threads), "--systems", name])
    bench_args.model_dir = args.model_dir
    warm = bench.warmup_prompt(args.token_ids)
    if name in bench.OUR_DTYPES:
        run = functools.partial(bench.run_ours, bench_args, workload, warm, name)
    else:
        model = bench.load_hf(args.model_dir)
        run = functools.partial(bench.HF_RUNNERS[name], bench_args, model, workload, warm)
    result = bench.in_worker_thread(run)
    bench.check_lengths(result, workload)
    gc.collect()  # drop this system's KV pool before the next one allocates its own
    output_tokens = sum(r.output_len for r in workload)
    return {
        "status": "ok",
        "system": name,
        "wall_s": result.wall_s,
        "output_tokens": output_tokens,
        "output_tok_s": output_tokens / result.wall_s,
        "lengths_ok": True,
        "outputs": result.outputs,
        **result.extra,
    }


def parity(ours: dict[str, Any], peer: dict[str, Any], ids: Sequence[str]) -> dict[str, Any]:
    """Greedy outputs equal to ours over ``ids``, and where each differing one diverges."""
    first_diff: dict[str, int] = {}
    for rid in ids:
        x, y = ours["outputs"][rid], peer["outputs"][rid]
        if x != y:
            pairs = enumerate(zip(x, y, strict=False))
            first_diff[rid] = next((i for i, (a, b) in pairs if a != b), min(len(x), len(y)))
    return {"checked": len(ids), "equal": len(ids) - len(first_diff), "first_diff_at": first_diff}


def compare(systems: dict[str, dict[str, Any]], ids: Sequence[str]) -> None:
    ours = systems.get("ours")
    for name, s in systems.items():
        if s.get("status") != "ok" or ours is None:
            continue
        s["ours_speedup"] = ours["output_tok_s"] / s["output_tok_s"]
        if name != "ours":
            s["parity_vs_ours"] = parity(ours, s, ids)


def print_table(report: dict[str, Any]) -> None:
    t = report["workload"]
    print(
        f"\n{t['num_requests']} requests: {t['prompt_tokens']} prompt + {t['output_tokens']} "
        f"output tokens, {report['threads']} threads, load avg {report['loadavg_start']}"
    )
    print(f"{'system':<14} {'wall s':>8} {'out tok/s':>10} {'TTFT p50':>9} {'ours x':>7}  parity")
    for name, s in report["systems"].items():
        if s.get("status") != "ok":
            print(f"{name:<14} {s['status']}  {s.get('setup') or s.get('reason') or ''}")
            continue
        ttft = s.get("ttft_p50_s")
        par = s.get("parity_vs_ours")
        speedup = f"{s['ours_speedup']:.2f}" if "ours_speedup" in s else ""
        same = "" if par is None else f"{par['equal']}/{par['checked']}"
        print(
            f"{name:<14} {s['wall_s']:>8.2f} {s['output_tok_s']:>10.1f} "
            f"{'' if ttft is None else f'{ttft:.2f}':>9} {speedup:>7}  "
            f"{same}"
        )


# -- main ------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peers", default=DEFAULT_PEERS, help=f"comma list of {', '.join(PEERS)}")
    p.add_argument("--no-ours", action="store_true", help="run the peers only")
    p.add_argument(
        "--local",
        default="",
        help="engine.py systems to run in this process besides ours, e.g. hf-cb,hf-static",
    )
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--vllm-dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--venv-root", type=Path, default=ROOT, help="where .venv-vllm etc. live")
    p.add_argument("--peer-timeout-s", type=float, default=1800.0)
    p.add_argument("--parity-requests", type=int, default=8)
    p.add_argument("--workload-file", type=Path, help="default: beside --out, or a temp file")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    args.peers = [s.strip() for s in args.peers.split(",") if s.strip()]
    args.local = [s.strip() for s in args.local.split(",") if s.strip()]
    if set(args.local) - LOCAL_SYSTEMS:
        p.error(f"unknown --local systems; choose from {', '.join(sorted(LOCAL_SYSTEMS))}")
    unknown = set(args.peers) - set(PEERS)
    if unknown:
        p.error(f"unknown peers {sorted(unknown)}; choose from {', '.join(PEERS)}")
    return args


def exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through run_peer, which kills the peer's group


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, exit_on_sigterm)
    bench = load_engine_bench()
    import tempfile

    import torch

    from worker.models.config import ModelConfig
    from worker.models.loader import load_tokenizer, resolve_model_dir

    torch.set_num_threads(args.threads)
    args.model_dir = resolve_model_dir(None)
    vocab = ModelConfig.from_dir(args.model_dir).vocab_size
    args.token_ids = bench.normal_token_ids(load_tokenizer(args.model_dir), vocab)
    workload = bench.make_workload(args.num_requests, args.seed, args.scale, args.token_ids)
    totals = bench.workload_totals(workload)
    workload_path = args.workload_file or (
        args.out.with_suffix(".workload.json")
        if args.out
        else Path(tempfile.mkdtemp(prefix="peers-")) / "workload.json"
    )
    write_workload(workload_path, workload)
    print(f"workload: {len(workload)} requests in {workload_path}", flush=True)
    loadavg = [round(x, 2) for x in os.getloadavg()]
    systems: dict[str, dict[str, Any]] = {}
    if not args.no_ours:
        print("running ours ...", flush=True)
        systems["ours"] = run_local(bench, args, workload, "ours")
    for name in args.local:
        print(f"running {name} ...", flush=True)
        systems[name] = run_local(bench, args, workload, name)
    for name in args.peers:
        print(f"running {name} ...", flush=True)
        systems[name] = run_peer(PEERS[name], args, workload_path)
        print(f"  {name}: {systems[name]['status']}", flush=True)
    compare(systems, [r.request_id for r in workload[: args.parity_requests]])
    report = {
        "config": {k: str(v) for k, v in vars(args).items() if k != "token_ids"},
        "workload": {k: v for k, v in totals.items() if not k.endswith("_lens")},
        "threads": args.threads,
        "loadavg_start": loadavg,
        "systems": systems,
    }
    print_table(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
