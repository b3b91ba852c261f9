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
from worker.engine.config import DEFAULT_CPU_KV_BYTES, CacheConfig, EngineConfig, SchedulerConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine.sampling_params import SamplingParams

# ours-bf16: our engine with bf16 weights and KV (AVX512-BF16 CPUs run bf16 GEMMs at ~2x fp32).
# "ours" and the HF peers take --dtype: fp32 on the CPU, bf16 on CUDA unless told otherwise.
OUR_DTYPES: dict[str, str | None] = {
    "ours": None,
    "ours-fp32": None,
    "ours-a8": None,
    "ours-abf16": None,
    "ours-a8bf16": None,
    "ours-kvbf16": None,
    "ours-a8-kvbf16": None,
    "ours-a8bf16-kvbf16": None,
    "ours-bf16": "bfloat16",
}
# ours-fp32: the GGUF's blocks dequantized to fp32 at load (exact HF parity), against "ours",
# which takes the engine's default (`auto`: the file's own blocks for a quantized GGUF on the CPU).
OUR_QUANTIZATION: dict[str, Any] = {"ours-fp32": "none"}  # one of EngineConfig.quantization's
# ours-a8: the default's blocks with x rounded to 8 bits (`--quant-activations int8`).
# ours-abf16: the default's blocks with steps of 48+ rows multiplied in bf16 (`bfloat16`).
# ours-a8bf16: both, x rounded to 8 bits below those rows (`int8+bfloat16`).
OUR_ACTIVATIONS: dict[str, Any] = {
    "ours-a8": "int8",
    "ours-abf16": "bfloat16",
    "ours-a8bf16": "int8+bfloat16",
    "ours-a8-kvbf16": "int8",
    "ours-a8bf16-kvbf16": "int8+bfloat16",
}
# ours-kvbf16: the default with its K/V cache in bf16 (`--kv-cache-dtype bfloat16`), as vLLM's
# auto cache dtype is for its bf16 model; ours-a8bf16-kvbf16: that and ours-a8bf16's activations;
# ours-a8-kvbf16: that and ours-a8's, the same thing where a CPU lacks bf16 arithmetic (AVX2:
# `bfloat16` falls back to exact x there, with a warning) under a name that says what runs.
OUR_KV_DTYPES: dict[str, Any] = {
    name: "bfloat16" for name in ("ours-kvbf16", "ours-a8-kvbf16", "ours-a8bf16-kvbf16")
}


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
    """``ours``, ``ours-fp32``, ``ours-a8`` or ``ours-bf16`` (``OUR_DTYPES``) on engine.py's
    flags."""
    # The model as the user named it (None: the bundled GGUF), not args.model_dir, its converted
    # HF directory: from that the engine cannot keep the file's blocks, so until 2026-12-04 "ours"
    # here ran fp32 weights, as ours-fp32 does.
    config = engine_config(args, args.model, args.device)
    dtype: Any = OUR_DTYPES[name] or args.dtype  # one of EngineConfig.dtype's (--dtype's choices)
    engine = LLMEngine(
        replace(
            config,
            dtype=dtype,
            quantization=OUR_QUANTIZATION.get(name, config.quantization),
            quant_activations=OUR_ACTIVATIONS.get(name, config.quant_activations),
            cache=replace(config.cache, dtype=OUR_KV_DTYPES.get(name, config.cache.dtype)),
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
