"""Interactive jobs under a saturating batch load: time to first token, and what preemption costs.

    python ops/bench/priority.py --out ops/bench/results/priority.json     # ~6 min on 2 cores
    python ops/bench/priority.py --batch-jobs 8 --interactive-jobs 3 --scale 0.25   # smoke

A backlog of ``--batch-jobs`` batch jobs (priority 10) is submitted at once and keeps every batch
slot busy; ``--interactive-jobs`` short interactive jobs (priority -10) then arrive one every
``--interactive-every-s`` seconds of wall time, open loop, from ``--interactive-start-s`` after
the engine's ``--interactive-after-steps``-th step (0: after the start). The same workload runs
on four configurations of our engine, one after another in this process (each a fresh engine):

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
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from ops.bench.common import args_record, in_worker_thread, write_report
from ops.bench.our_engine import add_engine_arguments, engine_config, greedy, warm_up
from producer.top.snapshot import percentile  # nearest rank: of 12 jobs, p99 is the slowest
from worker.engine.llm_engine import LLMEngine
from worker.engine.outputs import RequestOutput

BATCH, INTERACTIVE = 10, -10
CONFIGS = ("idle", "fifo", "priority", "preempt")


def make_engine(args: argparse.Namespace, preempt: bool) -> LLMEngine:
    config = engine_config(args, args.model)
    scheduler = replace(config.scheduler, preempt_for_priority=preempt)
    return LLMEngine(replace(config, scheduler=scheduler))


def prompts(args: argparse.Namespace, vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(args.seed)
    batch_len, chat_len = max(4, int(96 * args.scale)), max(4, int(32 * args.scale))
    # Ids from the lower half of the vocabulary: ordinary tokens, no specials at the top.
    batch = [[rng.randrange(vocab // 2) for _ in range(batch_len)] for _ in range(args.batch_jobs)]
    chats = [
        [rng.randrange(vocab // 2) for _ in range(chat_len)] for _ in range(args.interactive_jobs)
    ]
    return batch, chats


class ConfigRun:
    """One configuration: the backlog at once (but on ``idle``), the interactive jobs open
    loop, each job's tokens and its arrival and first-token times (s from the start)."""

    def __init__(self, args: argparse.Namespace, name: str) -> None:
        self.args, self.name = args, name
        self.engine = make_engine(args, preempt=name == "preempt")
        warm_up(self.engine, [5, 6, 7, 8], max_tokens=2, priority=BATCH)
        self.batch, self.chats = prompts(args, self.engine.model_config.vocab_size)
        self.out_batch, self.out_chat = max(2, int(96 * args.scale)), max(2, int(16 * args.scale))
        self.tokens: dict[str, list[int]] = {}
        self.arrived: dict[str, float] = {}
        self.first: dict[str, float] = {}
        self.computed_before = self.engine.scheduler.num_prompt_tokens_computed
        self.start = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.start

    def add(self, rid: str, ids: list[int], max_tokens: int, priority: int, at: float) -> None:
        params = greedy(max_tokens)
        self.engine.add_prompt(rid, params=params, prompt_token_ids=ids, priority=priority)
        self.arrived[rid], self.tokens[rid] = at, []

    def run(self) -> dict[str, Any]:
        fifo = self.name == "fifo"
        if self.name != "idle":
            for i, ids in enumerate(self.batch):
                self.add(f"batch-{i}", ids, self.out_batch, 0 if fifo else BATCH, 0.0)
        self.arrive_and_step(0 if fifo else INTERACTIVE)
        return self.result(self.now())

    def arrive_and_step(self, chat_priority: int) -> None:
        args, engine = self.args, self.engine
        due = [
            (args.interactive_start_s + i * args.interactive_every_s, i)
            for i in range(len(self.chats))
        ]
        # The schedule starts once the backlog has had its steps (an idle engine has no
        # backlog): on a loaded machine a few steps can outlast the whole schedule.
        steps, after = 0, 0 if self.name == "idle" else args.interactive_after_steps
        base = 0.0
        while due or engine.has_unfinished():
            if steps < after:  # no chat has arrived yet
                self.record(engine.step())
                steps += 1
                base = self.now()
                continue
            now = self.now()
            # Idle baseline: the next job arrives only once the previous one has finished.
            while due and (
                base + due[0][0] <= now or (self.name == "idle" and not engine.has_unfinished())
            ):
                _, i = due.pop(0)
                self.add(f"chat-{i}", self.chats[i], self.out_chat, chat_priority, self.now())
            if not engine.has_unfinished():
                time.sleep(max(0.0, min(0.01, base + due[0][0] - now)) if due else 0.0)
                continue
            self.record(engine.step())

    def record(self, outs: list[RequestOutput]) -> None:
        t = self.now()
        for out in outs:
            self.tokens[out.request_id].extend(out.new_token_ids)
            if out.new_token_ids:
                self.first.setdefault(out.request_id, t)

    def result(self, wall: float) -> dict[str, Any]:
        name, tokens, scheduler = self.name, self.tokens, self.engine.scheduler
        ttft = sorted(self.first[r] - self.arrived[r] for r in tokens if r.startswith("chat"))
        num_out = sum(len(t) for t in tokens.values())
        backlog = 0 if name == "idle" else len(self.batch)
        expected = len(ttft) * self.out_chat + backlog * self.out_batch
        assert num_out == expected, f"{name}: a job stopped early ({num_out} != {expected})"
        unique_prompt = sum(map(len, self.chats)) + sum(map(len, self.batch[:backlog]))
        computed = scheduler.num_prompt_tokens_computed - self.computed_before
        return {
            "config": name,
            "wall_s": wall,
            "output_tokens": num_out,
            "output_tok_s": num_out / wall,
            "ttft_p50_s": statistics.median(ttft),
            "ttft_p99_s": percentile(ttft, 99),
            "ttft_max_s": ttft[-1],
            "preemptions": dict(scheduler.preemptions_by_reason),
            "prompt_tokens_recomputed": computed - unique_prompt,
            "tokens": {r: t for r, t in tokens.items() if r.startswith("batch")},
        }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_arguments(p, max_num_seqs=16, max_num_batched_tokens=512)
    p.add_argument("--batch-jobs", type=int, default=48)
    p.add_argument("--interactive-jobs", type=int, default=12)
    p.add_argument("--interactive-start-s", type=float, default=2.0)
    p.add_argument("--interactive-every-s", type=float, default=3.0)
    p.add_argument("--interactive-after-steps", type=int, default=0)
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every length")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    runs: dict[str, dict[str, Any]] = {}
    for name in args.configs.split(","):
        print(f"{name} ...", flush=True)
        runs[name] = in_worker_thread(lambda n=name: ConfigRun(args, n).run())  # type: ignore[misc]
        gc.collect()
    ratios = summarize(runs)
    report = {
        "args": args_record(args),
        "torch": torch.__version__,
        "load_avg": os.getloadavg()[0],
        "runs": {n: {k: v for k, v in r.items() if k != "tokens"} for n, r in runs.items()},
        "ratios": ratios,
    }
    write_report(report, args.out)
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
