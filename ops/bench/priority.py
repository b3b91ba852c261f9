"""Interactive jobs under a saturating batch load: time to first token, and what preemption costs.

    python ops/bench/priority.py --out ops/bench/results/priority.json     # ~6 min on 2 cores
    python ops/bench/priority.py --batch-jobs 8 --interactive-jobs 3 --scale 0.25   # smoke

A backlog of ``--batch-jobs`` batch jobs (priority 10) is submitted at once and keeps every batch
slot busy; ``--interactive-jobs`` short interactive jobs (priority -10) then arrive one every
``--interactive-every-s`` seconds of wall time, open loop. The same workload runs on four
configurations of our engine, one after another in this process (each a fresh engine):

- ``idle``: each interactive job alone on an idle engine: the baseline time to first token;
- ``fifo``: every job the same priority, so interactive jobs queue behind the backlog;
- ``priority``: interactive jobs go first in the queue but wait for a free batch slot;
- ``preempt``: as ``priority``, and they preempt the newest batch job when no slot is free.

Reported per configuration: p50/p99 time to first token of the interactive jobs (arrival to
first token), wall time and output tokens/s of the whole run, preemptions, and prompt tokens
recomputed because of them. Throughput lost to preemption is ``preempt`` against ``priority``
(the same work). Greedy outputs of the batch jobs are compared across configurations.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.append(str(Path(__file__).resolve().parent))

import torch
from engine import in_worker_thread

from producer.top.snapshot import percentile  # nearest rank: of 12 jobs, p99 is the slowest
from worker.engine.config import DEFAULT_CPU_KV_BYTES, CacheConfig, EngineConfig, SchedulerConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine.sampling_params import SamplingParams

BATCH, INTERACTIVE = 10, -10
CONFIGS = ("idle", "fifo", "priority", "preempt")


def make_engine(args: argparse.Namespace, preempt: bool) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=args.model,
            device="cpu",
            num_threads=args.threads,
            cache=CacheConfig(memory_bytes=args.kv_cache_bytes),
            scheduler=SchedulerConfig(
                max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens,
                preempt_for_priority=preempt,
            ),
        )
    )


def prompts(args: argparse.Namespace, vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(args.seed)
    batch_len, chat_len = max(4, int(96 * args.scale)), max(4, int(32 * args.scale))
    # Ids from the lower half of the vocabulary: ordinary tokens, no specials at the top.
    batch = [[rng.randrange(vocab // 2) for _ in range(batch_len)] for _ in range(args.batch_jobs)]
    chats = [
        [rng.randrange(vocab // 2) for _ in range(chat_len)] for _ in range(args.interactive_jobs)
    ]
    return batch, chats


def run_config(args: argparse.Namespace, name: str) -> dict[str, Any]:
    engine = make_engine(args, preempt=name == "preempt")
    warm = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    engine.add_prompt("warm-up", params=warm, prompt_token_ids=[5, 6, 7, 8])
    while engine.has_unfinished():
        engine.step()
    batch, chats = prompts(args, engine.model_config.vocab_size)
    out_batch, out_chat = max(2, int(96 * args.scale)), max(2, int(16 * args.scale))
    batch_params = SamplingParams(temperature=0.0, max_tokens=out_batch, ignore_eos=True)
    chat_params = SamplingParams(temperature=0.0, max_tokens=out_chat, ignore_eos=True)
    chat_priority = 0 if name == "fifo" else INTERACTIVE
    tokens: dict[str, list[int]] = {}
    arrived: dict[str, float] = {}
    first: dict[str, float] = {}
    computed_before = engine.scheduler.num_prompt_tokens_computed
    start = time.perf_counter()
    if name != "idle":
        for i, ids in enumerate(batch):
            rid = f"batch-{i}"
            batch_priority = 0 if name == "fifo" else BATCH
            engine.add_prompt(
                rid, params=batch_params, prompt_token_ids=ids, priority=batch_priority
            )
            arrived[rid], tokens[rid] = 0.0, []
    due = [(args.interactive_start_s + i * args.interactive_every_s, i) for i in range(len(chats))]
    while due or engine.has_unfinished():
        now = time.perf_counter() - start
        # Idle baseline: the next job arrives only once the previous one has finished.
        while due and (due[0][0] <= now or (name == "idle" and not engine.has_unfinished())):
            _, i = due.pop(0)
            rid = f"chat-{i}"
            engine.add_prompt(
                rid, params=chat_params, prompt_token_ids=chats[i], priority=chat_priority
            )
            arrived[rid], tokens[rid] = time.perf_counter() - start, []
        if not engine.has_unfinished():
            time.sleep(max(0.0, min(0.01, due[0][0] - now)) if due else 0.0)
            continue
        outs = engine.step()
        t = time.perf_counter() - start
        for out in outs:
            tokens[out.request_id].extend(out.new_token_ids)
            if out.new_token_ids:
                first.setdefault(out.request_id, t)
    wall = time.perf_counter() - start
    ttft = sorted(first[r] - arrived[r] for r in tokens if r.startswith("chat"))
    num_out = sum(len(t) for t in tokens.values())
    expected = len(ttft) * out_chat + (0 if name == "idle" else len(batch) * out_batch)
    assert num_out == expected, f"{name}: a job stopped early ({num_out} != {expected})"
    unique_prompt = sum(len(p) for p in chats) + (0 if name == "idle" else sum(map(len, batch)))
    computed = engine.scheduler.num_prompt_tokens_computed - computed_before
    return {
        "config": name,
        "wall_s": wall,
        "output_tokens": num_out,
        "output_tok_s": num_out / wall,
        "ttft_p50_s": statistics.median(ttft),
        "ttft_p99_s": percentile(ttft, 99),
        "ttft_max_s": ttft[-1],
        "preemptions": dict(engine.scheduler.preemptions_by_reason),
        "prompt_tokens_recomputed": computed - unique_prompt,
        "tokens": {r: t for r, t in tokens.items() if r.startswith("batch")},
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="HF directory or .gguf; default the bundled SmolLM2-135M")
    p.add_argument("--batch-jobs", type=int, default=48)
    p.add_argument("--interactive-jobs", type=int, default=12)
    p.add_argument("--interactive-start-s", type=float, default=2.0)
    p.add_argument("--interactive-every-s", type=float, default=3.0)
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every length")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--kv-cache-bytes", type=int, default=DEFAULT_CPU_KV_BYTES)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    runs: dict[str, dict[str, Any]] = {}
    for name in args.configs.split(","):
        print(f"{name} ...", flush=True)
        runs[name] = in_worker_thread(lambda n=name: run_config(args, n))  # type: ignore[misc]
        gc.collect()
    ratios = summarize(runs)
    report = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "torch": torch.__version__,
        "load_avg": os.getloadavg()[0],
        "runs": {n: {k: v for k, v in r.items() if k != "tokens"} for n, r in runs.items()},
        "ratios": ratios,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
    return report


def summarize(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    print(
        f"{'config':<9} {'TTFT p50 s':>10} {'TTFT p99 s':>10} {'wall s':>7} {'out tok/s':>9} "
        f"{'preemptions':>11} {'recomputed':>10}"
    )
    for name, r in runs.items():
        print(
            f"{name:<9} {r['ttft_p50_s']:>10.3f} {r['ttft_p99_s']:>10.3f} {r['wall_s']:>7.1f} "
            f"{r['output_tok_s']:>9.1f} {sum(r['preemptions'].values()):>11} "
            f"{r['prompt_tokens_recomputed']:>10}"
        )
    ratios: dict[str, Any] = {}
    loaded = [n for n in ("fifo", "priority", "preempt") if n in runs]
    if "idle" in runs:
        for n in loaded:
            ratios[f"{n}_ttft_p99_over_idle"] = runs[n]["ttft_p99_s"] / runs["idle"]["ttft_p99_s"]
    if {"priority", "preempt"} <= runs.keys():
        ratios["throughput_lost_to_preemption"] = (
            1 - runs["preempt"]["output_tok_s"] / runs["priority"]["output_tok_s"]
        )
    if len(loaded) > 1:
        ref = runs[loaded[0]]["tokens"]
        ratios["batch_outputs_identical"] = all(runs[n]["tokens"] == ref for n in loaded[1:])
    print(
        "ratios: "
        + ", ".join(
            f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in ratios.items()
        )
    )
    return ratios


if __name__ == "__main__":
    main()
