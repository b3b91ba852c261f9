"""Our engine as the benches drive it: its flags, its config, greedy forced-length requests, a
warm-up, and ``ours``, the system engine.py (and peers/run_peers.py) holds the peers against.

The flags a bench shares (``--model``, ``--threads``, ``--kv-cache-bytes``, ``--max-num-seqs``,
``--max-num-batched-tokens``) are declared once here, defaulting to the engine's own; a
bench that wants other budgets passes them (priority.py saturates 16 slots, not 64).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ops.bench.engine_workload import WARMUP_OUTPUT, BenchRequest, SystemResult
from ops.bench.our_systems import OUR_SYSTEMS
from worker.engine.config import DEFAULT_CPU_KV_BYTES, CacheConfig, EngineConfig, SchedulerConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine.sampling_params import SamplingParams


def add_engine_arguments(
    p: argparse.ArgumentParser,
    max_num_seqs: int = SchedulerConfig.max_num_seqs,
    max_num_batched_tokens: int = SchedulerConfig.max_num_batched_tokens,
) -> None:
    p.add_argument("--model", help="HF directory or .gguf; default the bundled SmolLM2-135M")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    # Through float, so "8e9" reads as 8 GB.
    p.add_argument("--kv-cache-bytes", type=lambda v: int(float(v)), default=DEFAULT_CPU_KV_BYTES)
    p.add_argument("--max-num-seqs", type=int, default=max_num_seqs)
    p.add_argument("--max-num-batched-tokens", type=int, default=max_num_batched_tokens)


def engine_config(args: argparse.Namespace, model: str | None, device: str = "cpu") -> EngineConfig:
    """The config of ``add_engine_arguments``' flags; a bench varies it with
    ``dataclasses.replace`` (prefix caching off, no priority preemption, a dtype)."""
    return EngineConfig(
        model=model,
        device=device,
        num_threads=args.threads,
        cache=CacheConfig(memory_bytes=args.kv_cache_bytes),
        scheduler=SchedulerConfig(
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens
        ),
    )


def greedy(max_tokens: int) -> SamplingParams:
    """Exactly ``max_tokens`` tokens, greedy: every system does the same work."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def warm_up(
    engine: LLMEngine,
    prompt_ids: Sequence[int],
    max_tokens: int = WARMUP_OUTPUT,
    priority: int = 0,
) -> None:
    """One short request to completion before the clock starts: the first forward pays for
    allocation and kernel selection. A bench that runs batch-band work warms up in that band:
    a default-band warm-up would bound batch work for the scheduler's next 10 s (``HOLD_S``)."""
    engine.add_prompt(
        "warmup", params=greedy(max_tokens), prompt_token_ids=prompt_ids, priority=priority
    )
    while engine.has_unfinished():
        engine.step()


def step_all(engine: LLMEngine, workload: Sequence[BenchRequest]) -> dict[str, list[int]]:
    """Every request added at once, stepped to completion: each one's generated ids."""
    outputs: dict[str, list[int]] = {r.request_id: [] for r in workload}
    for r in workload:
        engine.add_prompt(r.request_id, params=greedy(r.output_len), prompt_token_ids=r.prompt_ids)
    while engine.has_unfinished():
        for out in engine.step():
            outputs[out.request_id].extend(out.new_token_ids)
    return outputs


class StepCounter:
    """Wraps the scheduler's ``schedule``: steps run and tokens through the model, recomputation
    after preemption included (the workload's totals leave it out)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.steps = self.tokens = 0
        self._schedule = engine.scheduler.schedule
        engine.scheduler.schedule = self  # type: ignore[method-assign]

    def __call__(self) -> Any:
        decision = self._schedule()
        if not decision.is_empty:
            self.steps += 1
            self.tokens += decision.num_batched_tokens
        return decision


def run_ours(
    args: argparse.Namespace, workload: Sequence[BenchRequest], warm: list[int], name: str = "ours"
) -> SystemResult:
    """``name``, one of ``OUR_SYSTEMS`` (``ours``, ``ours-fp32``, ...), on engine.py's flags."""
    # The model as the user named it (None: the bundled GGUF), not args.model_dir, its converted
    # HF directory: from that the engine cannot keep the file's blocks, so until 2026-12-04 "ours"
    # here ran fp32 weights, as ours-fp32 does.
    config = engine_config(args, args.model, args.device)
    system = OUR_SYSTEMS[name]
    # Each one of its EngineConfig field's values (--dtype's choices for dtype).
    dtype: Any = system.dtype or args.dtype
    quantization: Any = system.quantization or config.quantization
    activations: Any = system.activations or config.quant_activations
    kv_dtype: Any = system.kv_dtype or config.cache.dtype
    engine = LLMEngine(
        replace(
            config,
            dtype=dtype,
            quantization=quantization,
            quant_activations=activations,
            cache=replace(config.cache, dtype=kv_dtype),
            linear_backend=args.linear_backend,
            enforce_eager=args.enforce_eager,
        )
    )
    warm_up(engine, warm)
    preemptions_before = engine.scheduler.num_preemptions
    counter = StepCounter(engine)
    start = time.perf_counter()
    outputs = step_all(engine, workload)
    wall = time.perf_counter() - start
    extra = {
        "steps": counter.steps,
        "computed_tokens": counter.tokens,
        "preemptions": engine.scheduler.num_preemptions - preemptions_before,
        "kv_cache_tokens": engine.runner.num_blocks * engine.config.cache.block_size,
    }
    return SystemResult(name, wall, outputs, extra)
