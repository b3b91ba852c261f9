"""The overlapped engine loop against the plain one: ms per decode step, by ``--overlap-steps``.

    python ops/bench/overlap_loop.py --batches 1 64 256 --steps 30 --rounds 3 \
        --out ops/bench/results/overlap_loop.json

Same model and requests as ``host_overhead.py`` (random weights in the ``host-overhead`` shape:
hidden 64, 16 layers, the real 49,152-token vocabulary; ``B`` greedy requests with ignore_eos),
here with a stop string that never matches, so every step detokenizes and checks it as a chat
request would. Each mode gets a fresh engine per round and the modes alternate within a round,
so a noisy neighbour on a shared machine hits them alike; the figure is the median over all
timed steps in which all ``B`` requests decode, after ``--warmup`` such steps.

Compare modes in separate processes (``--modes off``, then ``--modes thread``): in one process,
once a thread-mode engine had run, the other modes' steps measured 4-40x slower or faster than
alone (B=64: off 577 ms against 57-71 alone), so a shared process says nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ops.bench.engine import environment, normal_token_ids
from ops.bench.random_model import write_random_model
from worker.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine.sampling_params import SamplingParams
from worker.models.loader import resolve_model_dir

MODES = ("off", "thread", "async")


def step_times(
    args: argparse.Namespace, model_dir: Path, batch: int, mode: str
) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of each timed all-decode step of one fresh engine; CPU time is the
    process's, all threads: on a shared machine it shows the work, wall time the overlap."""
    budget = max(512, batch)
    max_tokens = math.ceil(batch * args.prompt_len / budget) + args.warmup + args.steps + 4
    engine = LLMEngine(
        EngineConfig(
            model=str(model_dir),
            device="cpu",
            dtype="float32",
            num_threads=args.threads,
            overlap_steps=mode,  # type: ignore[arg-type]
            cache=CacheConfig(block_size=16, num_blocks=batch * (max_tokens // 16 + 3) + 1),
            scheduler=SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=budget),
        )
    )
    rng = random.Random(args.seed)
    vocab = normal_token_ids(engine.tokenizer, engine.model_config.vocab_size)
    params = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True, stop=("\x00never\x00",)
    )
    # add_prompt where requests are EngineRequest values (issue 18), else the older add_request.
    add: Any = getattr(engine, "add_prompt", engine.add_request)
    for i in range(batch):
        add(f"r{i}", None, params, prompt_token_ids=rng.choices(vocab, k=args.prompt_len))
    times: list[tuple[float, float]] = []
    steady = 0
    while len(times) < args.steps:
        all_decode = len(engine.scheduler.running) == batch == engine.last_num_batched_tokens
        steady = steady + 1 if all_decode else 0
        start, cpu = time.perf_counter(), time.process_time()
        engine.step()
        if steady > args.warmup:
            times.append((time.perf_counter() - start, time.process_time() - cpu))
    return times


def measure(args: argparse.Namespace, model_dir: Path) -> list[dict[str, Any]]:
    # The process's first engine pays one-time costs (kernel loading, first-call packing):
    # measured 1157 ms a step at B=64 against 44-75 ms for the next ones. Not timed.
    step_times(args, model_dir, args.batches[0], "off")
    rows = []
    for batch in args.batches:
        times: dict[str, list[tuple[float, float]]] = {m: [] for m in args.modes}
        for r in range(args.rounds):
            # Each round starts with another mode: the first engine of a batch measured slower
            # whatever its mode (B=1: 413 ms a step off, then 2.6 thread and 3.2 async).
            k = r % len(args.modes)
            for mode in args.modes[k:] + args.modes[:k]:
                times[mode] += step_times(args, model_dir, batch, mode)
        wall = {m: 1e3 * statistics.median(w for w, _ in t) for m, t in times.items()}
        cpu = {m: 1e3 * statistics.median(c for _, c in t) for m, t in times.items()}
        n = len(times[args.modes[0]])
        rows.append({"batch": batch, "median_wall_ms": wall, "median_cpu_ms": cpu, "steps": n})
        cells = [f"{m} {wall[m]:.2f} ms (cpu {cpu[m]:.2f})" for m in args.modes]
        print(f"B={batch}: " + ", ".join(cells), flush=True)
    return rows


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--steps", type=int, default=30, help="timed all-decode steps per engine")
    p.add_argument("--rounds", type=int, default=3, help="fresh engines per mode and batch")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--prompt-len", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("ops/bench/results/overlap_loop.json"))
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="overlap-") as tmp:
        model_dir = write_random_model(
            "host-overhead", resolve_model_dir(None), Path(tmp), torch.float32, "cpu"
        )
        rows = measure(args, model_dir)
    report = {"config": vars(args) | {"out": str(args.out)}, "batches": rows}
    report["environment"] = environment(args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
