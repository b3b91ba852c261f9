"""The peer engines of `run_peers.py`: where each one's venv is, its arguments, one run of it.

Each peer runs as a subprocess with its own venv's python (built by ``setup_vllm.sh`` /
``setup_llamacpp.sh``) on a workload JSON and prints one ``PEER_RESULT {json}`` line; a peer
whose venv (or built binary) is missing is reported as "not installed", not as a failure.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from subprocess import PIPE
from typing import Any

from ops.bench.our_systems import OUR_SYSTEMS

PEERS_DIR = Path(__file__).resolve().parent
RESULT_PREFIX = "PEER_RESULT "


def parse_result_line(text: str) -> dict[str, Any] | None:
    """The last ``PEER_RESULT {json}`` line of a peer's stdout, or None if there is none."""
    for line in reversed(text.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return dict(json.loads(line[len(RESULT_PREFIX) :]))
    return None


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
    "vllm-default": Peer("vllm-default", ".venv-vllm", "setup_vllm.sh", "vllm_cpu.py"),
    **{
        name: Peer(
            name, ".venv-llamacpp", "setup_llamacpp.sh", "llamacpp.py", needs=LLAMA_SERVER_BIN
        )
        for name in ("llama.cpp-f32", "llama.cpp-q4_1", "llama.cpp-gguf")
    },
}
DEFAULT_PEERS = "vllm-bind,vllm-nobind,llama.cpp-f32,llama.cpp-q4_1"
# engine.py's, run in this process
# ("ours" itself runs unless --no-ours.)
LOCAL_SYSTEMS = {*OUR_SYSTEMS, "hf-cb", "hf-static"} - {"ours"}


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
        from export_hf import vllm_model

        binds = {"vllm-nobind": "nobind", "vllm-default": "auto"}
        bind = binds.get(peer.name, f"0-{args.threads - 1}")
        model = vllm_model(args.vllm_dtype)
        compile_ = ["--compile"] if peer.name in ("vllm-compile", "vllm-default") else []
        return [
            *common,
            "--model",
            str(model),
            "--bind",
            bind,
            "--dtype",
            args.vllm_dtype,
            "--rounds",
            str(getattr(args, "rounds", 1)),
            *compile_,
        ]
    from export_hf import export_gguf_f32

    from worker.models.loader import bundled_model_path

    gguf = bundled_model_path()  # Q4_1
    if peer.name == "llama.cpp-gguf" and getattr(args, "gguf", None) is not None:
        gguf = Path(args.gguf)
    if peer.name == "llama.cpp-f32":
        bins = args.venv_root / peer.venv / Path(LLAMA_SERVER_BIN).parent
        gguf = export_gguf_f32(bins / "llama-quantize", gguf)
    server = args.venv_root / peer.venv / LLAMA_SERVER_BIN
    repack = ["--no-repack"] if getattr(args, "llamacpp_no_repack", False) else []
    return [
        *common,
        *("--gguf", str(gguf), "--server", str(server), "--threads", str(args.threads)),
        *("--rounds", str(getattr(args, "rounds", 1))),
        *repack,
    ]


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
