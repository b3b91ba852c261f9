"""Probe: how long the torch backend's decode K/V gathers take inside a model step vs alone.

    python ops/bench/decode_gather_probe.py [--batch 16] [--context 300]

Runs decode steps of the bundled model through the `ModelRunner`, timing the decode attention and
its `gather_kv` calls with host clocks (CPU work is synchronous), then times the same gathers over
the same 30 layer caches with no model around them. With a fresh multi-MB buffer per gather, the
in-model gathers were 4-9x slower than alone and bimodal (54-112 vs 11-14 ms per step, 16 x 300
on 2 cores): each allocation faulted its pages in again. The torch backend now reuses its
workspaces, which brought them to 17-21 ms.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

# Run as a script, this folder is sys.path[0] and its kernels.py would shadow the kernels package.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernels import reference
from worker.engine.config import CacheConfig, EngineConfig
from worker.engine.model_runner import ModelRunner
from worker.engine.scheduler_output import ScheduledSequence, SchedulerOutput
from worker.models.loader import load_model, resolve_model_dir


def timed(fn: Callable[..., Any], acc: dict[str, float], key: str) -> Callable[..., Any]:
    def wrapper(*args: Any) -> Any:
        start = time.perf_counter()
        result = fn(*args)
        acc[key] += time.perf_counter() - start
        return result

    return wrapper


def decode_step(args: argparse.Namespace) -> tuple[ModelRunner, SchedulerOutput]:
    """The bundled model's runner over a touched cache, and one decode step of ``--batch``
    sequences ``--context`` long, each on blocks of its own."""
    model = load_model(resolve_model_dir(None), torch.float32, torch.device("cpu"))
    blocks_per_seq = -(-args.context // 16)
    runner = ModelRunner(
        EngineConfig(cache=CacheConfig(block_size=16, num_blocks=args.batch * blocks_per_seq)),
        model,
        torch.device("cpu"),
    )
    for k, v in runner.kv_caches:  # touched, like a cache that prefill filled
        k.normal_()
        v.normal_()
    items = tuple(
        ScheduledSequence(
            f"s{i}",
            (5,),
            args.context - 1,
            tuple(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)),
            True,
        )
        for i in range(args.batch)
    )
    return runner, SchedulerOutput(items, args.batch, ())


def time_in_model(runner: ModelRunner, step: SchedulerOutput, steps: int) -> dict[str, float]:
    """ms per step, and of it the decode attention's and its gathers', after one warm-up."""
    acc = {"decode": 0.0, "gather": 0.0}
    gather = reference.gather_kv
    runner.backend.decode = timed(runner.backend.decode, acc, "decode")  # type: ignore[method-assign]
    reference.gather_kv = timed(gather, acc, "gather")
    try:
        runner.run(step)
        acc.update(decode=0.0, gather=0.0)
        start = time.perf_counter()
        for _ in range(steps):
            runner.run(step)
        step_ms = (time.perf_counter() - start) / steps * 1e3
    finally:
        reference.gather_kv = gather
    return {
        "step_ms": step_ms,
        "decode_attention_ms": acc["decode"] / steps * 1e3,
        "gathers_in_model_ms": acc["gather"] / steps * 1e3,
    }


def time_alone(runner: ModelRunner, step: SchedulerOutput, context: int, steps: int) -> float:
    """ms per step of the same gathers over the same layer caches, with no model around them."""
    _, _, meta, _ = runner.prepare(runner.batch_order(step))
    start = time.perf_counter()
    for _ in range(steps):
        for k, v in runner.kv_caches:
            reference.gather_kv(k, meta.block_tables, context)
            reference.gather_kv(v, meta.block_tables, context)
    return (time.perf_counter() - start) / steps * 1e3


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=300)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args(argv)
    runner, step = decode_step(args)
    result = time_in_model(runner, step, args.steps)
    result["gathers_alone_ms"] = alone_ms = time_alone(runner, step, args.context, args.steps)
    print(
        f"batch {args.batch} x context {args.context}, {torch.get_num_threads()} threads: "
        f"step {result['step_ms']:.0f} ms, decode attention {result['decode_attention_ms']:.0f}"
        f" ms, its gathers {result['gathers_in_model_ms']:.0f} ms; same gathers alone"
        f" {alone_ms:.0f} ms"
    )
    return result


if __name__ == "__main__":
    main()
