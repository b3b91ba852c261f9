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
- ``vllm-default``: vLLM as it ships: torch.compile and its own ``auto`` thread binding, which
  on x86 keeps one core per rank for the frontend (on 2 cores the model computes on 1).
- ``llama.cpp-f32``: ``llama-server`` with parallel slots on an F32 GGUF made from the bundled one
  by ``llama-quantize``: the same dequantized fp32 weights that ours and vLLM load.
- ``llama.cpp-q4_1``: the same server on the bundled Q4_1 GGUF itself, llama.cpp's native case
  (4-bit weights: less arithmetic and memory traffic per token than the fp32 systems do).
- ``llama.cpp-gguf``: the same server on ``--gguf``'s file (default: the bundled one), which
  ours and the ``--local`` systems then load too (a Q8_0 or Q4_0 file of the same model:
  ``ops/bench/requantize_gguf.py``); vLLM still loads the bundled model's float export.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
PEERS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))  # `worker` without an install, as engine.py does
sys.path.insert(0, str(PEERS_DIR))

from peer_systems import (  # noqa: E402
    DEFAULT_PEERS,
    LOCAL_SYSTEMS,
    PEERS,
    parse_result_line,
    peer_args,
    run_peer,
)

__all__ = [
    "PEERS",
    "parse_result_line",
    "peer_args",
    "run_peer",
]  # the peers' side, for callers and tests


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


# -- workload file ---------------------------------------------------------------------------------


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
    bench_args.model = None if args.gguf is None else str(args.gguf)
    warm = bench.warmup_prompt(args.token_ids)
    if name in bench.OUR_SYSTEMS:
        run = functools.partial(bench.run_ours, bench_args, workload, warm, name)
    else:
        model = bench.load_hf(args.model_dir)
        run = functools.partial(bench.HF_RUNNERS[name], bench_args, model, workload, warm)
    rounds = []
    for _ in range(args.rounds):
        result = bench.in_worker_thread(run)
        bench.check_lengths(result, workload)
        gc.collect()  # drop this system's KV pool before the next one allocates its own
        rounds.append(result)
    output_tokens = sum(r.output_len for r in workload)
    result = rounds[0]
    return {
        "status": "ok",
        "system": name,
        "wall_s": result.wall_s,
        "output_tokens": output_tokens,
        "output_tok_s": output_tokens / result.wall_s,
        "lengths_ok": True,
        "outputs": result.outputs,
        "rounds": [{"wall_s": r.wall_s, "output_tok_s": output_tokens / r.wall_s} for r in rounds],
        **result.extra,
    }


def parity(ours: dict[str, Any], peer: dict[str, Any], ids: Sequence[str]) -> dict[str, Any]:
    """Greedy outputs equal to ours over ``ids``, and where each differing one diverges; ids
    whose output the peer could not give in full (llama.cpp's stream, `llamacpp.complete`) are
    left out of ``checked`` and listed in ``skipped``."""
    skip = set(peer.get("incomplete_outputs", ()))
    skipped = [rid for rid in ids if rid in skip]
    ids = [rid for rid in ids if rid not in skip]
    first_diff: dict[str, int] = {}
    for rid in ids:
        x, y = ours["outputs"][rid], peer["outputs"][rid]
        if x != y:
            pairs = enumerate(zip(x, y, strict=False))
            first_diff[rid] = next((i for i, (a, b) in pairs if a != b), min(len(x), len(y)))
    return {
        "checked": len(ids),
        "equal": len(ids) - len(first_diff),
        "first_diff_at": first_diff,
        "skipped": skipped,
    }


def compare(systems: dict[str, dict[str, Any]], ids: Sequence[str]) -> None:
    ours = systems.get("ours")
    for name, s in systems.items():
        if s.get("status") != "ok" or ours is None:
            continue
        s["ours_speedup"] = ours["output_tok_s"] / s["output_tok_s"]
        pairs = zip(ours.get("rounds", []), s.get("rounds", []), strict=False)
        s["ours_speedup_rounds"] = [a["output_tok_s"] / b["output_tok_s"] for a, b in pairs]
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
        for i, r in enumerate(s.get("rounds", [])[1:], start=1):
            x = s.get("ours_speedup_rounds", [])
            ratio = f"{x[i]:.2f}" if i < len(x) else ""
            label = f"  round {i + 1}"
            print(f"{label:<14} {r['wall_s']:>8.2f} {r['output_tok_s']:>10.1f} {'':>9} {ratio:>7}")


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
    p.add_argument(
        "--vllm-dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="auto: vLLM's default (bfloat16 on x86 for this float32 model); float32: ours' "
        "arithmetic, for greedy parity",
    )
    p.add_argument(
        "--llamacpp-no-repack",
        action="store_true",
        help="llama-server --no-repack (its repacking crashed it at start on an AMX Xeon)",
    )
    p.add_argument(
        "--gguf",
        type=Path,
        help="the model file ours, --local systems and llama.cpp-gguf load (default: the bundled "
        "Q4_1 file)",
    )
    p.add_argument("--venv-root", type=Path, default=ROOT, help="where .venv-vllm etc. live")
    p.add_argument("--peer-timeout-s", type=float, default=1800.0)
    p.add_argument("--parity-requests", type=int, default=8)
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="timed runs of each system (vLLM, llama.cpp: one start-up)",
    )
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
    args.model_dir = resolve_model_dir(args.gguf)
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
    runs = [(name, lambda n: run_local(bench, args, workload, n)) for name in args.local]
    if not args.no_ours:
        runs.insert(0, ("ours", lambda n: run_local(bench, args, workload, n)))
    runs += [(name, lambda n: run_peer(PEERS[n], args, workload_path)) for name in args.peers]
    report: dict[str, Any] = {
        "config": {k: str(v) for k, v in vars(args).items() if k != "token_ids"},
        "workload": {k: v for k, v in totals.items() if not k.endswith("_lens")},
        "threads": args.threads,
        "loadavg_start": loadavg,
        "systems": systems,
    }
    parity_ids = [r.request_id for r in workload[: args.parity_requests]]
    for name, run in runs:
        print(f"running {name} ...", flush=True)
        before = [round(x, 2) for x in os.getloadavg()]
        systems[name] = run(name)
        systems[name]["loadavg_before_after"] = [before, [round(x, 2) for x in os.getloadavg()]]
        print(f"  {name}: {systems[name]['status']}", flush=True)
        compare(systems, parity_ids)
        # After every system, not only at the end: on a slow machine a full run of every peer
        # takes an hour, and one stopped early keeps what it measured ("partial": true).
        write_out(args.out, report, partial=True)
    write_out(args.out, report, partial=False)
    print_table(report)
    return report


def write_out(out: Path | None, report: dict[str, Any], partial: bool) -> None:
    report["partial"] = partial
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
