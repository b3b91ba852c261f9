"""llama.cpp's `llama-server` on a workload file: all requests at once, one JSON result line.

Runs with .venv-llamacpp's python (``bash ops/bench/peers/setup_llamacpp.sh``), importing nothing
of ours; ``run_peers.py`` passes the workload and the GGUF:

    .venv-llamacpp/bin/python ops/bench/peers/llamacpp.py --workload w.json --gguf M.gguf

The server gets ``--parallel`` slots (default: one per request, at most 64) with continuous
batching and one unified KV pool sized to the whole workload. Every request goes at once to the
native ``/completion`` endpoint as token ids (``/v1/completions`` takes them too, but its stream
carries text, not token ids), greedy, ``n_predict`` = its forced length with ``ignore_eos``,
streamed so that the first chunk gives its TTFT. The result is printed as ``PEER_RESULT {json}``.

llama-cpp-python's own server (``python -m llama_cpp.server``) is not used: it serializes requests
behind a global lock and has no parallel slots, and its /v1/completions takes text prompts only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

RESULT_PREFIX = "PEER_RESULT "
ROOT = Path(__file__).resolve().parents[3]
DEFAULT_SERVER = ROOT / ".venv-llamacpp" / "llama-server" / "bin" / "llama-server"
WARMUP_PROMPT = list(range(1000, 1016))
WARMUP_OUTPUT = 4


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", type=Path, required=True)
    p.add_argument("--gguf", type=Path, required=True)
    p.add_argument("--server", type=Path, default=DEFAULT_SERVER)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--parallel", type=int, help="slots; default: one per request, at most 64")
    p.add_argument("--batch-size", type=int, default=512, help="-b and -ub: tokens per step")
    p.add_argument("--port", type=int, default=18477)
    p.add_argument("--startup-timeout-s", type=float, default=180.0)
    p.add_argument("--label", default="llama.cpp")
    p.add_argument(
        "--rounds", type=int, default=1, help="timed runs of the workload after one start-up"
    )
    # On a 2-core Xeon with AMX (2026-12-04) llama-server's default weight repacking killed it
    # at start (SIGSEGV after "threadpool init", 1 or 2 threads); without it, it serves.
    p.add_argument("--no-repack", action="store_true", help="llama-server --no-repack")
    return p.parse_args(argv)


def server_command(args: argparse.Namespace, requests: Sequence[dict[str, Any]]) -> list[str]:
    parallel = args.parallel or min(len(requests), 64)
    # One pool shared by every slot, large enough for all requests at once (+16 per slot).
    need = sum(len(r["prompt_token_ids"]) + r["max_tokens"] for r in requests) + 16 * parallel
    ctx = max(2048, -(-need // 256) * 256)
    return [
        str(args.server),
        *("--model", str(args.gguf), "--host", "127.0.0.1", "--port", str(args.port)),
        *("--parallel", str(parallel), "--kv-unified", "--cont-batching", "--ctx-size", str(ctx)),
        *("--threads", str(args.threads), "--threads-batch", str(args.threads)),
        *("--batch-size", str(args.batch_size), "--ubatch-size", str(args.batch_size)),
        # No host-RAM prompt cache: random prompts share nothing, and requests say cache_prompt
        # false, so saving slot states would be pure overhead.
        *("--cache-ram", "0", "--no-webui", "--log-disable"),
        *(["--no-repack"] if args.no_repack else []),
    ]


def wait_healthy(client: httpx.Client, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode} while starting")
        try:
            if client.get("/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"llama-server not healthy after {timeout_s} s")


def server_failure(
    proc: subprocess.Popen[bytes], log: Path, exc: Exception, lines: int = 20
) -> str:
    """What a dropped connection says, with the server's exit status (None: still running)
    and the last ``lines`` of its log, so a failed run names its cause."""
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        pass
    tail = log.read_text(errors="replace").splitlines()[-lines:]
    return (
        f"llama-server connection failed ({exc!r}); server exit status {proc.returncode}; "
        f"its log {log} ends:\n" + "\n".join(tail)
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End the server: SIGTERM, then SIGKILL after 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


async def complete(client: httpx.AsyncClient, prompt: list[int], n: int) -> dict[str, Any]:
    """One streamed greedy completion of exactly ``n`` tokens: its ids, TTFT, the server's own
    count of the tokens it generated, and timings.

    The count comes from the final chunk (``tokens_predicted``), not from the streamed ids: a
    token whose text ends in an incomplete UTF-8 character gets no chunk of its own, and its id
    is never streamed (llama-server's ``process_token`` sends a partial only for complete text;
    the final chunk of a stream carries no ids). With byte-level tokens that happens on random
    prompts: the full-scale mix's r4 streamed 15 of its 23 ids (2026-12-04)."""
    body = {
        "prompt": prompt,
        "n_predict": n,
        "ignore_eos": True,
        "temperature": 0.0,
        "top_k": 1,
        "cache_prompt": False,
        "stream": True,
        "return_tokens": True,
    }
    tokens: list[int] = []
    ttft: float | None = None
    final: dict[str, Any] = {}
    start = time.perf_counter()
    async with client.stream("POST", "/completion", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[len("data: ") :])
            if chunk.get("tokens") and ttft is None:
                ttft = time.perf_counter() - start
            tokens.extend(chunk.get("tokens") or [])
            if chunk.get("stop"):
                final = chunk
    return {
        "tokens": tokens,
        "num_generated": final.get("tokens_predicted", len(tokens)),
        "ttft_s": ttft,
        "timings": final.get("timings", {}),
    }


async def run_all(
    port: int, requests: Sequence[dict[str, Any]], rounds: int = 1
) -> list[tuple[float, list[Any]]]:
    """One warm-up, then ``rounds`` timed runs of every request at once: (wall s, results) each.
    Every request says ``cache_prompt: false`` (`complete`), so a round finds nothing of the
    one before in its slot."""
    limits = httpx.Limits(max_connections=len(requests) + 1)
    base = f"http://127.0.0.1:{port}"
    # The warm-up on a connection of its own. A timed request that reused the one the warm-up's
    # stream ended on was dropped unanswered, the server alive (`server_failure`), in 9 of 14
    # single-request runs on a Zen 2 EPYC (1 and 2 threads); 0 of 8 since (2026-12-07).
    async with httpx.AsyncClient(base_url=base, timeout=None) as client:
        await complete(client, WARMUP_PROMPT, WARMUP_OUTPUT)
    timed = []
    for _ in range(rounds):  # a client each, as the first round had
        async with httpx.AsyncClient(base_url=base, timeout=None, limits=limits) as client:
            start = time.perf_counter()
            jobs = [complete(client, r["prompt_token_ids"], r["max_tokens"]) for r in requests]
            results = await asyncio.gather(*jobs)
            timed.append((time.perf_counter() - start, results))
    return timed


def summarize(
    args: argparse.Namespace, requests: Sequence[dict[str, Any]], wall: float, results: list[Any]
) -> dict[str, Any]:
    lengths = [res["num_generated"] for res in results]
    # Requests whose ids the stream left incomplete (`complete`): no parity is read from them.
    incomplete = [
        r["request_id"]
        for r, res in zip(requests, results, strict=True)
        if len(res["tokens"]) != res["num_generated"]
    ]
    wrong = [
        (r["request_id"], n, r["max_tokens"])
        for r, n in zip(requests, lengths, strict=True)
        if n != r["max_tokens"]
    ]
    ttft = [res["ttft_s"] for res in results if res["ttft_s"] is not None]
    output_tokens = sum(lengths)
    return {
        "system": args.label,
        "wall_s": wall,
        "num_requests": len(requests),
        "prompt_tokens": sum(len(r["prompt_token_ids"]) for r in requests),
        "output_tokens": output_tokens,
        "output_tok_s": output_tokens / wall,
        "lengths_ok": not wrong,
        "wrong_lengths": wrong[:5],
        "outputs": {
            r["request_id"]: res["tokens"] for r, res in zip(requests, results, strict=True)
        },
        "incomplete_outputs": incomplete,
        "ttft_s": ttft,
        "ttft_mean_s": statistics.fmean(ttft) if ttft else None,
        "ttft_p50_s": statistics.median(ttft) if ttft else None,
        "ttft_p90_s": sorted(ttft)[min(len(ttft) - 1, int(0.9 * len(ttft)))] if ttft else None,
    }


def with_rounds(
    args: argparse.Namespace,
    requests: Sequence[dict[str, Any]],
    timed: Sequence[tuple[float, list[Any]]],
) -> dict[str, Any]:
    """The first round's summary (outputs, parity, TTFTs), as run_peers reads every peer's, with
    ``rounds`` holding each round's wall time, output tok/s and TTFTs, as vllm_cpu.py's; a
    round whose lengths are wrong puts its requests in ``wrong_lengths``."""
    summaries = [summarize(args, requests, wall, results) for wall, results in timed]
    result = summaries[0]
    keys = ("wall_s", "output_tok_s", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s")
    result["rounds"] = [{k: s[k] for k in keys} for s in summaries]
    wrong = [w for s in summaries for w in s["wrong_lengths"]]
    result["lengths_ok"], result["wrong_lengths"] = not wrong, wrong[:5]
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if not args.server.exists():
        raise SystemExit(f"{args.server} missing: run bash ops/bench/peers/setup_llamacpp.sh")
    requests = json.loads(args.workload.read_text())
    command = server_command(args, requests)
    log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{args.port}", timeout=5.0) as client:
            wait_healthy(client, proc, args.startup_timeout_s)
            props = client.get("/props").json()
        startup_s = time.perf_counter() - started
        try:
            timed = asyncio.run(run_all(args.port, requests, args.rounds))
        except httpx.TransportError as exc:
            raise RuntimeError(server_failure(proc, Path(log.name), exc)) from exc
    finally:
        stop(proc)
    result = with_rounds(args, requests, timed)
    result["startup_s"] = startup_s
    result["config"] = {
        "command": command,
        "total_slots": props.get("total_slots"),
        "build_info": props.get("build_info"),
        "server_log": log.name,
    }
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    if result["wrong_lengths"]:
        print(f"output lengths differ: {result['wrong_lengths']}", file=sys.stderr)
        sys.exit(1)
    return result


if __name__ == "__main__":
    main()
