"""Host cost per decode step: where one `LLMEngine.step` goes when the model does almost no math.

    python ops/bench/host_overhead.py --batches 1 64 256 --steps 30 \
        --out ops/bench/results/host_overhead.json

The model is random weights in the ``host-overhead`` shape of `random_model.py` (hidden 64, 16
layers, SmolLM2's real 49,152-token vocabulary), so the layers' matmuls are negligible and a step
times what the host does around them: scheduling, building the step's tensors, launching each
layer's ops, the vocabulary-wide logits and sampling, and per-request bookkeeping. ``B`` requests
of ``--prompt-len`` random tokens decode greedily (``--sampling mixed``: every other one samples
with temperature and top-p; ``--min-tokens``: EOS stays masked) with ``ignore_eos``; only steps
in which all ``B`` decode are timed, after ``--warmup`` such steps.

Each phase is timed by wrapping the engine's own parts from outside (no timing code in the
engine): ``schedule`` and ``update`` of the scheduler, ``prepare`` and ``run`` of the runner,
the sampler, and ``RequestState.append`` (stop checks and detokenization, one call per request;
``detokenize`` is its `IncrementalDetokenizer.add_tokens` part). ``forward`` is run - prepare:
the layers, and the runner's own Python around them (batch order, gathering the sampling rows
and the LM head's projection into `LogitsBuffer`). ``other`` is the rest of ``step``: the
engine's per-request glue (sampling requests, outputs) and freeing the step's tensors. ``host_ms``
is the step less forward and sampling: scheduling, input preparation and output processing,
what issue 19's goal bounds (1 ms at batch 256).

This times the plain loop (``overlap_steps`` "auto" is "off" on the CPU), where `step` runs every
phase one after another on one thread: every phase is on the critical path, and the named
phases add up to the step (``named_share_of_step`` near 1). The overlapped loop (`overlap.py`)
takes detokenizing and stop strings off it; ``overlap_loop.py`` times the two loops against
each other. Each wrapper adds well under a microsecond per call.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import torch

# Run as a script, this folder is sys.path[0] and its kernels.py would shadow the kernels package.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ops.bench.engine import environment, in_worker_thread, normal_token_ids
from ops.bench.random_model import write_random_model
from worker.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from worker.engine.detokenizer import IncrementalDetokenizer
from worker.engine.llm_engine import LLMEngine
from worker.engine.request_state import RequestState
from worker.engine.sampling_params import SamplingParams
from worker.models.loader import resolve_model_dir

# (key, row label) in step order; "detokenize" is the part of "append" spent in the detokenizer.
PHASES = (
    ("schedule", "schedule"),
    ("prepare", "input preparation (ModelRunner.prepare)"),
    ("forward", "forward (layers + logits)"),
    ("sample", "sampling"),
    ("update", "output: scheduler update"),
    ("append", "output: RequestState.append"),
    ("detokenize", "  of which detokenize"),
    ("other", "other step glue"),
)
P = ParamSpec("P")
R = TypeVar("R")


class StepTimer:
    """Seconds per phase of the step in progress, and of every finished one."""

    def __init__(self) -> None:
        self.current: dict[str, float] = {}
        self.steps: list[dict[str, float]] = []

    def timed(self, phase: str, fn: Callable[P, R]) -> Callable[P, R]:
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                self.current[phase] = self.current.get(phase, 0.0) + elapsed

        return wrapper

    def end_step(self, step_s: float, keep: bool) -> None:
        phases, self.current = self.current, {}
        if not keep:
            return
        t = {k: phases.get(k, 0.0) for k, _ in PHASES}
        t["forward"] = phases.get("run", 0.0) - t["prepare"]
        t["other"] = step_s - sum(v for k, v in t.items() if k not in ("detokenize", "other"))
        t["step"] = step_s
        self.steps.append(t)


@contextmanager
def instrumented(engine: LLMEngine, timer: StepTimer) -> Iterator[None]:
    """Wrap the engine's parts until exit: attributes of its own instances, and the methods of
    the per-request classes (called once per request per step)."""
    parts: list[tuple[object, str, str]] = [
        (engine.scheduler, "schedule", "schedule"),
        (engine.scheduler, "update", "update"),
        (engine.runner, "prepare", "prepare"),
        (engine.runner, "run", "run"),
        (engine, "sampler", "sample"),  # called as sampler(logits, requests)
        (RequestState, "append", "append"),
        (IncrementalDetokenizer, "add_tokens", "detokenize"),
    ]
    originals = [getattr(obj, attr) for obj, attr, _ in parts]
    for (obj, attr, phase), fn in zip(parts, originals, strict=True):
        setattr(obj, attr, timer.timed(phase, fn))
    try:
        yield
    finally:
        for (obj, attr, _), fn in zip(parts, originals, strict=True):
            setattr(obj, attr, fn)


def request_params(i: int, args: argparse.Namespace, max_tokens: int) -> SamplingParams:
    """Greedy; ``--sampling mixed``: odd requests sample; ``--min-tokens``: EOS masked all along."""
    sampled = args.sampling == "mixed" and i % 2 == 1
    return SamplingParams(
        max_tokens=max_tokens,
        min_tokens=max_tokens if args.min_tokens else 0,
        temperature=0.8 if sampled else 0.0,
        top_p=0.9 if sampled else 1.0,
        ignore_eos=True,
    )


def measure(args: argparse.Namespace, model_dir: Path, batch: int) -> dict[str, Any]:
    """Median ms per phase over ``args.steps`` steps in which all ``batch`` requests decode."""
    budget = max(512, batch)  # the default step budget, raised to fit one decode per request
    prefill_steps = math.ceil(batch * args.prompt_len / budget)
    max_tokens = prefill_steps + args.warmup + args.steps + 2  # nobody finishes while timed
    blocks = batch * math.ceil((args.prompt_len + max_tokens) / 16) + 1
    engine = LLMEngine(
        EngineConfig(
            model=str(model_dir),
            device="cpu",
            dtype="float32",
            attention_backend=args.backend,
            num_threads=args.threads,
            cache=CacheConfig(block_size=16, num_blocks=blocks),
            scheduler=SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=budget),
        )
    )
    rng = random.Random(args.seed)
    vocab = normal_token_ids(engine.tokenizer, engine.model_config.vocab_size)
    for i in range(batch):
        prompt = rng.choices(vocab, k=args.prompt_len)
        params = request_params(i, args, max_tokens)
        engine.add_prompt(f"r{i}", params=params, prompt_token_ids=prompt)
    return summarise(time_steps(engine, args, batch), batch)


def time_steps(engine: LLMEngine, args: argparse.Namespace, batch: int) -> StepTimer:
    """Step until ``args.steps`` all-decode steps (after ``args.warmup`` of them) are timed."""
    timer = StepTimer()
    steady = 0  # consecutive steps in which every request decodes
    with instrumented(engine, timer):
        while len(timer.steps) < args.steps:
            running = engine.scheduler.running  # all decode when all run, each one token behind
            all_decode = len(running) == batch and all(
                s.num_uncomputed_tokens == 1 for s in running
            )
            start = time.perf_counter()
            engine.step()
            step_s = time.perf_counter() - start
            steady = steady + 1 if all_decode else 0
            timer.end_step(step_s, keep=steady > args.warmup)
            if not engine.has_unfinished():
                raise RuntimeError("requests finished before the timed steps were done")
    return timer


def summarise(timer: StepTimer, batch: int) -> dict[str, Any]:
    keys = [k for k, _ in PHASES] + ["step"]
    ms = {k: 1e3 * statistics.median(s[k] for s in timer.steps) for k in keys}
    named = [sum(s[k] for k, _ in PHASES if k not in ("detokenize", "other")) for s in timer.steps]
    # Scheduling, input preparation and output processing: the step less forward and sampling.
    host = [s["step"] - s["forward"] - s["sample"] for s in timer.steps]
    return {
        "batch": batch,
        "steps": len(timer.steps),
        "median_ms": ms,
        "host_ms": 1e3 * statistics.median(host),
        "step_ms_all": [round(1e3 * s["step"], 3) for s in timer.steps],
        # Near 1: the named phases, run one after another, are the step (nothing overlaps).
        "named_share_of_step": sum(named) / sum(s["step"] for s in timer.steps),
        "host_share": 1.0 - ms["forward"] / ms["step"],  # what overlapping the host could hide
        "critical_path": [k for k, _ in PHASES],  # step() runs each in turn on one thread
        "tokens_per_s": batch / (ms["step"] / 1e3),
    }


def markdown(report: dict[str, Any]) -> str:
    runs = report["batches"]

    def row(label: str, cells: list[str], critical: str = "") -> str:
        return f"| {label} | {critical} | " + " | ".join(cells) + " |"

    lines = [row("phase (median ms per step)", [f"B={r['batch']}" for r in runs], "critical path")]
    lines.append("| --- | --- |" + " ---: |" * len(runs))
    lines += [row(label, [f"{r['median_ms'][k]:.2f}" for r in runs], "yes") for k, label in PHASES]
    lines += [
        row(
            "**host: step - forward - sampling**",
            [f"**{r['host_ms']:.2f}**" for r in runs],
        ),
        row("**step**", [f"**{r['median_ms']['step']:.2f}**" for r in runs]),
        row("named phases / step", [f"{r['named_share_of_step']:.2f}" for r in runs]),
        row("host share (1 - forward / step)", [f"{100 * r['host_share']:.0f}%" for r in runs]),
        row("output tok/s", [f"{r['tokens_per_s']:.0f}" for r in runs]),
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--steps", type=int, default=30, help="timed all-decode steps per batch")
    p.add_argument("--warmup", type=int, default=3, help="all-decode steps before timing")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--backend", choices=("cpu", "torch"), default="cpu", help="attention backend")
    p.add_argument("--sampling", choices=("greedy", "mixed"), default="greedy")
    p.add_argument("--min-tokens", action="store_true", help="min_tokens = max_tokens: EOS masked")
    p.add_argument("--prompt-len", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", type=Path, help="an HF dir to use instead of writing random weights")
    p.add_argument("--shape", default="host-overhead", help="random_model.py shape")
    p.add_argument(
        "--tokenizer", type=Path, help="dir with config.json + tokenizer; default SmolLM2-135M's"
    )
    p.add_argument("--out", type=Path, default=Path("ops/bench/results/host_overhead.json"))
    return p.parse_args(argv)


def run(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    runs = [in_worker_thread(functools.partial(measure, args, model_dir, b)) for b in args.batches]
    config = {k: v for k, v in vars(args).items() if k not in ("out", "model", "tokenizer")}
    return {"config": config, "environment": environment(args.threads), "batches": runs}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.model is not None:
        report = run(args, args.model)
    else:
        tokenizer = args.tokenizer or resolve_model_dir(None)
        with tempfile.TemporaryDirectory(prefix="host-overhead-") as tmp:
            model_dir = write_random_model(args.shape, tokenizer, Path(tmp), torch.float32, "cpu")
            report = run(args, model_dir)
    report["markdown"] = markdown(report)
    print(report["markdown"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
