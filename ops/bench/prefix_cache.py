"""Prefix caching on a chat mix: jobs sharing one long system prompt, cache on against off.

    python ops/bench/prefix_cache.py --out ops/bench/results/prefix_cache.json
    python ops/bench/prefix_cache.py --jobs 4 --output-tokens 4       # smoke test, ~1 min

Every job is a chat through the model's chat template: the same system prompt of about
``--system-tokens`` tokens (numbered house rules), then a short user question of its own. Each
generates exactly ``--output-tokens`` tokens (greedy, ignore_eos). All jobs are submitted at once,
a burst arriving at an idle worker, and stepped to completion, first on an engine with prefix
caching off, then on one with it on (same weights, budgets and KV bytes; each engine warmed up on
an unrelated prompt, so the system prompt is never cached before its run).

Reported for each: prompt tokens computed (the scheduler's count: cached ones are not), cache hit
tokens, wall time, output tokens/s, and time to first token (submission to the job's first token;
mean and max). Greedy outputs of the two runs are compared token for token.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

# Run as a script: put the repository first so `worker` imports without an install.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from ops.bench.common import args_record, in_worker_thread, write_report
from ops.bench.our_engine import add_engine_arguments, engine_config, greedy
from worker.engine.llm_engine import LLMEngine

TOPICS = (
    "billing", "refunds", "shipping", "passwords", "privacy", "outages", "pricing", "invoices",
    "accessibility", "accounts", "exports", "integrations", "security", "mobile apps", "upgrades",
)  # fmt: skip
STYLES = ("two short paragraphs", "a numbered list", "one sentence", "a table", "plain words")
QUESTIONS = (
    "How do I reset my password?",
    "Why was I charged twice this month?",
    "Can I export my data as CSV?",
    "Is there an outage right now?",
    "How long does shipping to Canada take?",
    "Where do I find last year's invoices?",
    "Do you support single sign-on?",
    "How do I delete my account?",
    "What does the Pro plan cost per seat?",
    "Can I get a refund for an annual plan?",
    "Is the mobile app available on Android tablets?",
    "How do I connect the Slack integration?",
    "Who can see the files I upload?",
    "Why is the dashboard loading slowly?",
    "Can I change the currency on my invoices?",
    "How do I add a teammate to my workspace?",
)


def system_prompt(engine: LLMEngine, target_tokens: int) -> str:
    """Numbered house rules, added until the system message alone reaches ``target_tokens``."""
    lines = ["You are the support assistant of Paternoster Cloud. Follow these house rules."]
    i = 0
    while len(engine.encode(" ".join(lines))) < target_tokens:
        topic, style = TOPICS[i % len(TOPICS)], STYLES[i % len(STYLES)]
        lines.append(
            f"Rule {i + 1}: when a customer asks about {topic}, answer in {style}, "
            f"link the {topic} help page, and never promise dates you cannot keep."
        )
        i += 1
    return " ".join(lines)


def chats(system: str, num_jobs: int) -> list[list[dict[str, str]]]:
    return [
        [
            {"role": "system", "content": system},
            {"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} (ticket {i})"},
        ]
        for i in range(num_jobs)
    ]


def make_engine(args: argparse.Namespace, caching: bool) -> LLMEngine:
    config = engine_config(args, args.model)
    return LLMEngine(replace(config, cache=replace(config.cache, enable_prefix_caching=caching)))


def run_once(args: argparse.Namespace, caching: bool) -> dict[str, Any]:
    engine = make_engine(args, caching)
    engine.generate(["A warm-up prompt that shares nothing with the jobs."], greedy(4))
    system = system_prompt(engine, args.system_tokens)
    prompts = [engine.encode(chat) for chat in chats(system, args.jobs)]
    params = greedy(args.output_tokens)
    computed_before = engine.scheduler.num_prompt_tokens_computed
    hits_before = engine.cache_stats().num_hit_tokens
    tokens: dict[str, list[int]] = {f"job-{i}": [] for i in range(len(prompts))}
    first_token_s: dict[str, float] = {}
    steps = 0
    start = time.perf_counter()
    for rid, ids in zip(tokens, prompts, strict=True):
        engine.add_prompt(rid, params=params, prompt_token_ids=ids)
    while engine.has_unfinished():
        outs = engine.step()
        now = time.perf_counter() - start
        steps += 1
        for out in outs:
            tokens[out.request_id].extend(out.new_token_ids)
            first_token_s.setdefault(out.request_id, now)
    wall = time.perf_counter() - start
    num_output = sum(len(t) for t in tokens.values())
    assert num_output == args.jobs * args.output_tokens, "a job stopped early"
    ttft = list(first_token_s.values())
    return {
        "prefix_caching": caching,
        "wall_s": wall,
        "steps": steps,
        "preemptions": engine.scheduler.num_preemptions,
        "prompt_tokens": sum(len(p) for p in prompts),
        "prompt_tokens_computed": engine.scheduler.num_prompt_tokens_computed - computed_before,
        "cache_hit_tokens": engine.cache_stats().num_hit_tokens - hits_before,
        "output_tokens": num_output,
        "output_tok_s": num_output / wall,
        "ttft_mean_s": statistics.fmean(ttft),
        "ttft_max_s": max(ttft),
        "prompt_lens": [len(p) for p in prompts],
        "tokens": tokens,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_arguments(p)
    p.add_argument("--jobs", type=int, default=32)
    p.add_argument("--system-tokens", type=int, default=500)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    runs = {}
    for name, caching in (("off", False), ("on", True)):
        print(f"prefix caching {name} ...", flush=True)
        runs[name] = in_worker_thread(lambda c=caching: run_once(args, c))  # type: ignore[misc]
        gc.collect()  # drop this engine's KV pool before the next allocates its own
    off, on = runs["off"], runs["on"]
    same = sum(off["tokens"][rid] == on["tokens"][rid] for rid in off["tokens"])
    ratios = {
        "prompt_tokens_computed_off_over_on": off["prompt_tokens_computed"]
        / on["prompt_tokens_computed"],
        "output_tok_s_on_over_off": on["output_tok_s"] / off["output_tok_s"],
        "ttft_mean_off_over_on": off["ttft_mean_s"] / on["ttft_mean_s"],
        "wall_off_over_on": off["wall_s"] / on["wall_s"],
    }
    print(
        f"\n{args.jobs} jobs, prompts {min(on['prompt_lens'])}-{max(on['prompt_lens'])} tokens "
        f"(system ~{args.system_tokens}), {args.output_tokens} output tokens each, "
        f"{torch.get_num_threads()} threads, load avg {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'cache':<6} {'prompt computed':>16} {'hits':>7} {'wall s':>7} {'out tok/s':>10} "
        f"{'TTFT mean s':>12} {'TTFT max s':>11} {'steps':>6}"
    )
    for name, r in runs.items():
        print(
            f"{name:<6} {r['prompt_tokens_computed']:>16} {r['cache_hit_tokens']:>7} "
            f"{r['wall_s']:>7.2f} {r['output_tok_s']:>10.1f} {r['ttft_mean_s']:>12.2f} "
            f"{r['ttft_max_s']:>11.2f} {r['steps']:>6}"
        )
    print("ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    print(f"greedy outputs identical on and off: {same}/{len(off['tokens'])} jobs")
    report = {
        "args": args_record(args),
        "torch": torch.__version__,
        "runs": {k: {kk: vv for kk, vv in r.items() if kk != "tokens"} for k, r in runs.items()},
        "ratios": ratios,
        "identical_jobs": same,
    }
    write_report(report, args.out)
    if args.out:
        print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
