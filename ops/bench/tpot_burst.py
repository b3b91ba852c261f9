"""TPOT targets and aging on the engine directly (issue 21): a burst of long prompts under
running chats, and batch jobs under an unbroken stream of chats.

    python ops/bench/tpot_burst.py --threads 1 --out /tmp/tpot_burst.json
    # 2 cores under load 6-10: burst ~4 min (8 x 2k prompts), starvation ~1.5 min

``burst``: ``--chats`` interactive chats decode; once each has ``--burst-after`` tokens,
``--long-prompts`` prompts of ``--long-len`` tokens (default band) arrive at once. Chat TPOT is
the time between a chat's successive tokens; "in burst" counts the tokens produced while any
long prompt is still prefilling (up to the last one's first token). Three runs, a fresh engine
each: the chats alone, the burst with TPOT targets off (a fixed 512-token budget, as before),
and with the default targets.

``starvation``: ``--batch-jobs`` batch jobs arrive at once while interactive jobs keep arriving
so that ``--chat-backlog`` of them always wait (closed loop: the batch is always full) for
``--stream-s`` seconds. With aging (``--aging-per-s``) every batch job should start once it has
waited 20 / rate seconds; without it, none starts until the stream ends.

The model is random weights of ``--shape`` (random_model.py; smollm2-135m: the CPU serving
path's step costs) unless ``--model`` is given; weights do not change a step's time.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from ops.bench.common import args_record, environment, in_worker_thread, write_report
from ops.bench.our_engine import add_engine_arguments, engine_config, greedy, warm_up
from ops.bench.random_model import write_random_model
from producer.top.snapshot import percentile
from worker.engine.config import DEFAULT_TPOT_TARGET_MS, SchedulerConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine.step_targets import format_tpot_targets, parse_tpot_targets
from worker.models.loader import resolve_model_dir

INTERACTIVE, DEFAULT, BATCH = -10, 0, 10


class Run:
    """One engine, driven by hand: requests added, stepped, each token's time recorded."""

    def __init__(self, args: argparse.Namespace, model: Path, **policy: Any) -> None:
        config = engine_config(args, str(model))
        self.engine = LLMEngine(replace(config, scheduler=replace(config.scheduler, **policy)))
        warm_up(self.engine, [5, 6, 7, 8], max_tokens=2, priority=BATCH)
        self.rng = random.Random(args.seed)
        self.vocab = self.engine.model_config.vocab_size // 2  # ordinary ids, no specials
        self.times: dict[str, list[float]] = {}
        self.start = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.start

    def add(self, rid: str, prompt_len: int, max_tokens: int, priority: int) -> None:
        ids = [self.rng.randrange(self.vocab) for _ in range(prompt_len)]
        self.engine.add_prompt(
            rid, params=greedy(max_tokens), prompt_token_ids=ids, priority=priority
        )
        self.times[rid] = [self.now()]  # arrival, then one entry per token

    def step(self) -> None:
        outs = self.engine.step()
        t = self.now()
        for out in outs:
            self.times[out.request_id] += [t] * len(out.new_token_ids)


def burst_run(args: argparse.Namespace, model: Path, mode: str) -> dict[str, Any]:
    """``mode``: alone, off (no targets) or on (the default targets)."""
    targets = {} if mode == "off" else parse_tpot_targets(args.tpot_target_ms)
    policy = {
        "min_prefill_chunk_tokens": args.min_prefill_chunk_tokens,
        "tpot_target_ms": targets,
        "tpot_slowdown_max": args.tpot_slowdown_max,
    }
    run = Run(args, model, **policy)
    chats = [f"chat-{i}" for i in range(args.chats)]
    for rid in chats:
        run.add(rid, args.chat_len, args.chat_tokens, INTERACTIVE)
    longs: list[str] = []
    while run.engine.has_unfinished():
        started = all(len(run.times[c]) > args.burst_after for c in chats)
        if mode != "alone" and not longs and started:
            longs = [f"long-{i}" for i in range(args.long_prompts)]
            for rid in longs:
                run.add(rid, args.long_len, 1, DEFAULT)
        run.step()
    burst_start = min((run.times[r][0] for r in longs), default=0.0)
    burst_end = max((run.times[r][1] for r in longs), default=float("inf"))
    gaps, in_burst = [], []
    for c in chats:
        for before, after in itertools.pairwise(run.times[c][1:]):  # token to token
            gaps.append(after - before)
            if longs and burst_start < after <= burst_end:  # a token the burst delayed
                in_burst.append(after - before)
    measured = in_burst if longs else gaps
    return {
        "mode": mode,
        "chat_tpot_p50_s": statistics.median(measured),
        "chat_tpot_p99_s": percentile(sorted(measured), 99),
        "chat_tpot_mean_s": statistics.fmean(measured),
        "tokens_measured": len(measured),
        "long_ttft_max_s": (burst_end - burst_start) if longs else None,
        "wall_s": run.now(),
        "step_cost": vars(run.engine.scheduler.step_cost.cost),
    }


def starvation_run(args: argparse.Namespace, model: Path, aging_per_s: float) -> dict[str, Any]:
    run = Run(args, model, aging_per_s=aging_per_s, max_num_seqs=args.slots)
    num_chats = args.slots + args.chat_backlog  # the stream first: it fills every slot
    for i in range(num_chats):
        run.add(f"chat-{i}", args.chat_len, args.stream_chat_tokens, INTERACTIVE)
    run.step()
    batch = [f"batch-{i}" for i in range(args.batch_jobs)]
    for rid in batch:
        run.add(rid, args.batch_len, args.batch_tokens, BATCH)
    while run.engine.has_unfinished() or run.now() < args.stream_s:
        waiting = len(run.engine.scheduler.waiting) - sum(len(run.times[b]) == 1 for b in batch)
        # At least a slot's worth: chats that started together end together, and every slot
        # they free must find a chat waiting, or a batch job would take it without aging.
        while run.now() < args.stream_s and waiting < max(args.chat_backlog, args.slots):
            run.add(f"chat-{num_chats}", args.chat_len, args.stream_chat_tokens, INTERACTIVE)
            num_chats, waiting = num_chats + 1, waiting + 1
        run.step()
    arrived = run.times[batch[0]][0]
    done = [run.times[b][-1] - arrived for b in batch]
    firsts = [run.times[b][1] - arrived for b in batch]
    return {
        "aging_per_s": aging_per_s,
        "chats_served": num_chats,
        "batch_arrived_s": arrived,  # the times below count from here
        "batch_first_token_min_s": min(firsts),
        "batch_finished_max_s": max(done),
        "batch_finished_during_stream": sum(t + arrived <= args.stream_s for t in done),
        "bound_s": 20 / aging_per_s if aging_per_s else None,
        "wall_s": run.now(),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_arguments(p, max_num_seqs=16, max_num_batched_tokens=512)
    p.add_argument("--cases", default="burst,starvation")
    p.add_argument("--shape", default="smollm2-135m", help="random_model.py shape")
    p.add_argument("--modes", default="alone,off,on", help="burst runs, alone first")
    targets = format_tpot_targets(DEFAULT_TPOT_TARGET_MS)
    p.add_argument("--tpot-target-ms", default=targets, help="of the 'on' runs")
    chunk = SchedulerConfig.min_prefill_chunk_tokens
    p.add_argument("--min-prefill-chunk-tokens", type=int, default=chunk)
    slowdown = SchedulerConfig.tpot_slowdown_max
    p.add_argument("--tpot-slowdown-max", type=float, default=slowdown, help="0: off")
    p.add_argument("--chats", type=int, default=8)
    p.add_argument("--chat-len", type=int, default=32)
    p.add_argument("--chat-tokens", type=int, default=96)
    p.add_argument("--burst-after", type=int, default=8, help="chat tokens before the burst")
    p.add_argument("--long-prompts", type=int, default=8)
    p.add_argument("--long-len", type=int, default=2048)
    p.add_argument("--batch-jobs", type=int, default=20)
    p.add_argument("--batch-len", type=int, default=32)
    p.add_argument("--batch-tokens", type=int, default=16)
    p.add_argument("--slots", type=int, default=4, help="max_num_seqs of the starvation case")
    p.add_argument("--stream-s", type=float, default=40.0)
    p.add_argument("--stream-chat-tokens", type=int, default=16)
    p.add_argument(
        "--chat-backlog", type=int, default=4, help="chats kept waiting; at least --slots"
    )
    p.add_argument("--aging-per-s", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    return p.parse_args(argv)


def run_cases(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    report: dict[str, Any] = {"args": args_record(args), "environment": environment(args.threads)}
    cases = args.cases.split(",")
    if "burst" in cases:
        runs = {}
        for mode in args.modes.split(","):
            runs[mode] = in_worker_thread(functools.partial(burst_run, args, model, mode))
            if "alone" in runs:
                alone_s = runs["alone"]["chat_tpot_p50_s"]
                runs[mode]["p50_over_alone"] = runs[mode]["chat_tpot_p50_s"] / alone_s
            print({k: v for k, v in runs[mode].items() if k != "step_cost"}, flush=True)
        report["burst"] = runs
    if "starvation" in cases:
        report["starvation"] = []
        for rate in (args.aging_per_s, 0.0):
            r = in_worker_thread(functools.partial(starvation_run, args, model, rate))
            report["starvation"].append(r)
            print(r, flush=True)
    report["load_avg_end"] = os.getloadavg()[0]
    return report


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.model is not None:
        report = run_cases(args, Path(args.model))
    else:
        with tempfile.TemporaryDirectory(prefix="tpot-burst-") as tmp:
            tokenizer = resolve_model_dir(None)
            model = write_random_model(args.shape, tokenizer, Path(tmp), torch.float32, "cpu")
            report = run_cases(args, model)
    write_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
