"""End-to-end throughput: our engine against Hugging Face transformers on one seeded workload.

    python ops/bench/engine.py --out results/engine.json        # 64 requests, ~16k in, ~8.7k out
    python ops/bench/engine.py --num-requests 6 --scale 0.1     # smoke test: under 2 min, 2 cores
    python ops/bench/engine.py --systems ours,hf-cb --hf-sequential
    python ops/bench/engine.py --device cuda --model DIR --kv-cache-bytes 8e9   # GPU, bf16
    python ops/bench/engine.py --workload nano-vllm --num-requests 256   # nano-vllm's bench.py

Every system runs the same requests (random token ids, forced output lengths, greedy) one after
another in this process, on the same fp32 weights and torch thread count:

- ``ours``: `LLMEngine`, every request added at once, stepped to completion, ``ignore_eos``.
- ``hf-static``: HF ``generate`` on left-padded batches of 8 in workload order; each batch runs to
  its longest forced length, and only each request's own tokens count as output.
- ``hf-cb``: HF continuous batching (`continuous_batching_context_manager`) on its paged cache,
  with the same KV bytes, step token budget and batch size cap as ours.
- ``hf-seq`` (``--hf-sequential``): HF ``generate`` one request at a time.

EOS never ends a request: ours ignores it; HF generate runs with ``eos_token_id=None`` (nothing
stops, nothing is masked, so greedy logits match ``ignore_eos``; ``min_new_tokens`` is set to the
length too) and HF continuous batching gets ``eos_token_id=-1`` per request (its "no EOS").
Every system's output lengths are checked against the forced lengths.

Throughput counts useful tokens only (the workload's prompt and forced output tokens), so every
system is measured on the same work. Model FLOPs of that work: ``2 * non-embedding params`` per
processed token, ``2 * vocab * hidden`` per sampled token, plus ``4 * layers * q_heads *
head_size * context`` of attention per processed token; shown against a measured matmul in the
same dtype.

The pieces: ``engine_workload.py`` (the requests and their FLOPs), ``our_engine.py`` (``ours``),
``hf_peers.py`` (the HF peers), ``engine_report.py`` (rates, parity, the table); this file is the
command line that runs them.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

# Run as a script: put the repository first so `worker` imports without an install.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from ops.bench.common import DEFAULT_DTYPE, args_record, environment, in_worker_thread, write_report
from ops.bench.engine_report import Ceilings, parity_vs_ours, print_table, summarize_all
from ops.bench.engine_workload import (
    WORKLOADS,
    BenchRequest,
    SystemResult,
    check_lengths,
    make_workload,
    non_embedding_params,
    normal_token_ids,
    useful_flops,
    warmup_prompt,
    workload_totals,
)
from ops.bench.hf_peers import HF_RUNNERS, load_hf
from ops.bench.our_engine import add_engine_arguments, run_ours
from ops.bench.our_systems import OUR_SYSTEMS
from worker.models.config import ModelConfig
from worker.models.loader import load_tokenizer, resolve_model_dir

SYSTEMS = (*OUR_SYSTEMS, *HF_RUNNERS)
DEFAULT_SYSTEMS = "ours,hf-static,hf-cb"
PARITY_REQUESTS = 8


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_arguments(p)
    p.add_argument("--device", choices=tuple(DEFAULT_DTYPE), default="cpu")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="weights and KV of ours and the HF peers; default float32 on cpu, bfloat16 on cuda",
    )
    p.add_argument(
        "--linear-backend",
        choices=("auto", "torch", "onednn"),
        default="auto",
        help="ours' CPU projections (EngineConfig.linear_backend)",
    )
    p.add_argument(
        "--keep-going", action="store_true", help="record a failing system and run the rest"
    )
    p.add_argument("--systems", default=DEFAULT_SYSTEMS, help=f"comma list of {', '.join(SYSTEMS)}")
    p.add_argument("--hf-sequential", action="store_true", help="also run hf-seq")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="mix")
    p.add_argument("--enforce-eager", action="store_true", help="ours: no CUDA graphs")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every length range")
    add_hf_arguments(p)
    p.add_argument("--parity-requests", type=int, default=PARITY_REQUESTS)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    args.dtype = args.dtype or DEFAULT_DTYPE[args.device]
    if args.hf_sequential and "hf-seq" not in args.systems:
        args.systems.append("hf-seq")
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown or not args.systems:
        p.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    return args


def add_hf_arguments(p: argparse.ArgumentParser) -> None:
    """The HF peers' own knobs (hf_peers.py); the rest they share with ours."""
    p.add_argument("--hf-static-batch-size", type=int, default=8)
    p.add_argument("--hf-cb-attn", choices=("sdpa", "paged|eager"), default="sdpa")
    p.add_argument("--hf-cb-page-size", type=int, default=256)
    p.add_argument("--hf-cb-max-batch-tokens", type=int, help="default: --max-num-batched-tokens")
    p.add_argument("--hf-cb-prefix-sharing", action="store_true")
    p.add_argument("--hf-cb-timeout-s", type=float, default=3600.0)


def run_systems(
    args: argparse.Namespace, workload: Sequence[BenchRequest], warm: list[int]
) -> tuple[dict[str, SystemResult], dict[str, str]]:
    """Each system's result, and with ``--keep-going`` the error of each system that failed."""
    results: dict[str, SystemResult] = {}
    failed: dict[str, str] = {}
    hf_model: Any = None
    for name in args.systems:
        print(f"running {name} ...", flush=True)
        try:
            if name in HF_RUNNERS:
                if hf_model is None:
                    hf_model = load_hf(args.model_dir, args.dtype, args.device)
                run = functools.partial(HF_RUNNERS[name], args, hf_model, workload, warm)
            else:
                run = functools.partial(run_ours, args, workload, warm, name)
            results[name] = in_worker_thread(run)
            check_lengths(results[name], workload)
        except Exception as e:
            if not args.keep_going:
                raise
            failed[name] = f"{type(e).__name__}: {e}"
            print(f"  {name} FAILED: {failed[name]}", flush=True)
            results.pop(name, None)
            continue
        gc.collect()  # drop our engine's KV pool before the next system allocates its own
        print(f"  {name}: {results[name].wall_s:.2f} s", flush=True)
    return results, failed


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)  # every peer, in this process and its CB thread
    torch.manual_seed(args.seed)
    args.model_dir = resolve_model_dir(args.model)
    mc = ModelConfig.from_dir(args.model_dir)
    token_ids = normal_token_ids(load_tokenizer(args.model_dir), mc.vocab_size)
    classes = WORKLOADS[args.workload]
    workload = make_workload(args.num_requests, args.seed, args.scale, token_ids, classes)
    totals = workload_totals(workload, classes)
    print(
        f"workload: {totals['num_requests']} requests {totals['requests_per_class']}, "
        f"{totals['prompt_tokens']} prompt + {totals['output_tokens']} output tokens",
        flush=True,
    )
    env = environment(args.threads, args.device)
    ceilings = Ceilings.measure(args.device, args.dtype, args.systems)
    flops = useful_flops(mc, workload)
    results, failed = run_systems(args, workload, warmup_prompt(token_ids))
    report = {
        "config": args_record(args),
        "environment": env,
        "workload": totals,
        "classes": [asdict(c) for c in classes],
        "matmul_gflop_s": ceilings.dtype,
        "matmul_bf16_gflop_s": ceilings.bf16,
        "useful_gflop": flops["total"] / 1e9,
        "flops": flops,
        "non_embedding_params": non_embedding_params(mc),
        "systems": summarize_all(results, totals, flops, ceilings),
        "parity_vs_ours": parity_vs_ours(results, workload, args.parity_requests),
        "failed": failed,
    }
    report = json.loads(json.dumps(report))  # what --out holds: tuples become lists
    print_table(report)
    write_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
