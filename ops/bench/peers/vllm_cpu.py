"""vLLM (CPU build) on a workload file: offline ``LLM.generate``, one JSON result line.

Runs with .venv-vllm's python (``bash ops/bench/peers/setup_vllm.sh``), so it imports nothing of
ours; ``run_peers.py`` writes the workload and the model directory (``export_hf.py``):

    .venv-vllm/bin/python ops/bench/peers/vllm_cpu.py --workload w.json --model DIR --bind 0-1

The workload is a JSON list of ``{"request_id", "prompt_token_ids", "max_tokens"}``. Every request
is a ``TokensPrompt`` with greedy ``SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True)``;
all go to one ``generate`` call, so vLLM's scheduler batches them as ours does. One warm-up
request runs first. The result is printed as ``PEER_RESULT {json}`` on stdout (vLLM logs around
it): wall time, prompt and output tokens, output tok/s, per-request TTFT from
``RequestOutput.metrics.first_token_latency`` (stats are on: offline generate turns them off by
default), and whether every output had exactly ``max_tokens`` tokens (the run fails if not).

``--bind`` sets ``VLLM_CPU_OMP_THREADS_BIND`` before vLLM is imported: a CPU list such as
``0-1`` pins one OpenMP thread per core, ``nobind`` leaves placement to the OS, ``auto`` is
vLLM's default (on x86 it reserves one core per rank for the frontend: 1 of our 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULT_PREFIX = "PEER_RESULT "
WARMUP_PROMPT = list(range(1000, 1016))  # ordinary tokens of SmolLM2's vocabulary
WARMUP_OUTPUT = 4


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", type=Path, required=True)
    p.add_argument("--model", type=Path, required=True, help="a Hugging Face directory")
    p.add_argument("--bind", default="0-1", help="VLLM_CPU_OMP_THREADS_BIND: 0-1, nobind, auto")
    p.add_argument("--kv-cache-gib", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE")
    # auto: vLLM's default. On an x86 CPU it computes a float32 checkpoint in bfloat16 (vLLM
    # 0.32 `_resolve_auto_dtype`: float32 is downcast to the platform's first supported dtype).
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    p.add_argument("--max-num-seqs", type=int, help="default: vLLM's")
    p.add_argument("--max-num-batched-tokens", type=int, help="default: vLLM's")
    p.add_argument(
        "--compile", action="store_true", help="allow torch.compile (default: enforce_eager)"
    )
    p.add_argument("--label", default="vllm-cpu")
    p.add_argument("--rounds", type=int, default=1, help="timed generate calls after one start-up")
    return p.parse_args(argv)


def set_env(args: argparse.Namespace) -> None:
    """vLLM reads these when imported and when its engine process starts: set them first."""
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.bind
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(args.kv_cache_gib)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing to fetch: the model is a local dir
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")


def load_workload(path: Path) -> list[dict[str, Any]]:
    requests = json.loads(path.read_text())
    for r in requests:
        if r["max_tokens"] < 1 or not r["prompt_token_ids"]:
            raise ValueError(f"bad request {r.get('request_id')}: empty prompt or max_tokens < 1")
    return requests


def ttft_stats(outputs: Sequence[Any]) -> dict[str, Any]:
    """Time to first token per request, from the arrival of the request (seconds)."""
    ttft = [o.metrics.first_token_latency for o in outputs if getattr(o, "metrics", None)]
    if not ttft:
        return {"ttft_s": None}
    ttft_sorted = sorted(ttft)
    return {
        "ttft_s": ttft,
        "ttft_mean_s": statistics.fmean(ttft),
        "ttft_p50_s": statistics.median(ttft),
        "ttft_p90_s": ttft_sorted[min(len(ttft) - 1, int(0.9 * len(ttft)))],
    }


def make_llm(args: argparse.Namespace) -> Any:
    """vLLM's offline engine on ``args.model``: eager unless ``--compile``, stats kept."""
    from vllm import LLM

    engine_args: dict[str, Any] = {
        "model": str(args.model),
        "dtype": args.dtype,
        "enforce_eager": not args.compile,
        "disable_log_stats": False,  # keeps RequestOutput.metrics (TTFT)
        "seed": 0,
    }
    if args.max_num_seqs:
        engine_args["max_num_seqs"] = args.max_num_seqs
    if args.max_num_batched_tokens:
        engine_args["max_num_batched_tokens"] = args.max_num_batched_tokens
    return LLM(**engine_args)


def greedy(n: int) -> Any:
    """Exactly ``n`` greedy tokens, EOS ignored."""
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True)


def run_config(args: argparse.Namespace, llm: Any) -> dict[str, Any]:
    """The settings the run had, vLLM's scheduler budgets as it chose them."""
    import vllm

    scheduler = llm.llm_engine.vllm_config.scheduler_config
    return {
        "vllm": vllm.__version__,
        "bind": args.bind,
        "kv_cache_gib": args.kv_cache_gib,
        "dtype": args.dtype,
        "model_dtype": str(llm.llm_engine.vllm_config.model_config.dtype),  # what auto chose
        "enforce_eager": not args.compile,
        "max_num_seqs": scheduler.max_num_seqs,
        "max_num_batched_tokens": scheduler.max_num_batched_tokens,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    set_env(args)
    from vllm.inputs import TokensPrompt

    requests = load_workload(args.workload)
    started = time.perf_counter()
    llm = make_llm(args)
    startup_s = time.perf_counter() - started
    llm.generate([TokensPrompt(prompt_token_ids=WARMUP_PROMPT)], greedy(WARMUP_OUTPUT))
    prompts = [TokensPrompt(prompt_token_ids=r["prompt_token_ids"]) for r in requests]
    rounds = []
    for _ in range(args.rounds):
        llm.reset_prefix_cache()  # else round 2 finds every prompt cached (TTFT p50 23.6 -> 7.2 s)
        start = time.perf_counter()
        outputs = llm.generate(prompts, [greedy(r["max_tokens"]) for r in requests], use_tqdm=False)
        wall = time.perf_counter() - start
        rounds.append({"wall_s": wall, **ttft_stats(outputs)})
    wall = rounds[0]["wall_s"]

    lengths = [len(o.outputs[0].token_ids) for o in outputs]
    wrong = [
        (r["request_id"], n, r["max_tokens"])
        for r, n in zip(requests, lengths, strict=True)
        if n != r["max_tokens"]
    ]
    result = {
        "system": args.label,
        "wall_s": wall,
        "startup_s": startup_s,
        "num_requests": len(requests),
        "prompt_tokens": sum(len(r["prompt_token_ids"]) for r in requests),
        "output_tokens": sum(lengths),
        "output_tok_s": sum(lengths) / wall,
        "lengths_ok": not wrong,
        "wrong_lengths": wrong[:5],
        "outputs": {
            r["request_id"]: list(o.outputs[0].token_ids)
            for r, o in zip(requests, outputs, strict=True)
        },
        **rounds[0],
        "rounds": [{**r, "output_tok_s": sum(lengths) / r["wall_s"]} for r in rounds],
        "config": run_config(args, llm),
    }
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    if wrong:
        print(f"output lengths differ from max_tokens: {wrong[:5]}", file=sys.stderr)
        sys.exit(1)
    return result


if __name__ == "__main__":
    main()
