"""Decode steps against their byte floor, and the share of their wall time the device sat idle.

    python ops/bench/gpu_steps.py --device cuda --model DIR --out steps.json   # H200: ~30 s
    python ops/bench/gpu_steps.py --model DIR --batch-sizes 1,3 --context 16 --steps 3  # CPU smoke

For each batch size B, B requests with prompts of ``--context`` random tokens are prefilled, then
stepped through `LLMEngine.step` as decode-only steps of B rows: ``--warmup`` steps, ``--steps``
timed ones (wall clock, device synchronised at both ends), then ``--profile-steps`` under
torch.profiler. The engine is the one users get (CUDA graphs unless ``--enforce-eager``).

- **Byte floor** of a step: every weight read once (the LM head's table, tied or not; the
  embedding's B rows left out), the K/V of B rows of their context, and one new token's K/V
  written per row, over the device-to-device copy bandwidth measured at the start (bytes read +
  written over the time of a large copy, as ``ops/bench/kernels.py`` measures its ceiling).
- **Idle share**: 1 - (union of the device's busy intervals) / (the profiled window). On CUDA the
  intervals are kernels, copies and memsets; on the CPU they are torch ops (our pybind C++
  kernels are not dispatcher ops and count as idle), so a CPU run only proves the path works.
- **The host's side** (``phase_ms``, ``--phase-steps`` more steps): each phase of the step
  timed from outside the engine in wall ms (`step_timer.phase_ms`: schedule, run and within it
  prepare, sample, resolve, update, emit, detokenize, other), ``host`` being the step less its
  wait for the device's ids: where an idle device's time goes on the host. The per-request
  wrappers add ~0.5 us a row to ``host`` (two a row); ``ms_per_step`` is timed without them.
  The largest batch's steps are also run under cProfile (``--host-profile-steps``), its top
  functions by own time in ``host_profile``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args, get_type_hints

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.append(str(Path(__file__).resolve().parent))

import torch
from step_floor import copy_gbps, profile_idle, step_bytes, synchronize

from ops.bench.common import DEFAULT_DTYPE, write_report
from ops.bench.engine_workload import normal_token_ids
from ops.bench.step_timer import host_profile, phase_ms
from worker.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine.sampling_params import SamplingParams

DEFAULT_BATCHES = "1,8,32,64,128,256"  # graph sizes (1, 2, 4, 8, then every 8) up to 256
COPY_BYTES = {"cuda": 1 << 30, "cpu": 64 << 20}  # 1 GiB streams from HBM past the 50 MiB L2


class StepBench:
    """One engine, one batch size after another: prefill, warm up, time, profile, abort."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.engine = LLMEngine(
            EngineConfig(
                model=args.model,
                device=args.device,
                dtype=args.dtype,
                enforce_eager=args.enforce_eager,
                quantization=args.quantization,
                cache=CacheConfig(memory_bytes=args.kv_cache_bytes),
                scheduler=SchedulerConfig(
                    max_num_seqs=max(args.batch_sizes),
                    max_num_batched_tokens=args.max_num_batched_tokens,
                ),
            )
        )
        self.mc = self.engine.model_config
        self.token_ids = normal_token_ids(self.engine.tokenizer, self.mc.vocab_size)
        self.generated: dict[str, int] = {}

    def step(self) -> int:
        """One engine step; how many rows it computed (a decode-only step: its batch)."""
        for out in self.engine.step():
            if out.request_id in self.generated:
                self.generated[out.request_id] += len(out.new_token_ids)
        return self.engine.last_num_batched_tokens

    def admit(self, batch: int) -> tuple[list[str], int]:
        """Add ``batch`` requests with long enough budgets; their ids, and how many steps their
        prefill may take (chunks of --max-num-batched-tokens, one step of slack)."""
        a = self.args
        rng = random.Random(f"{a.seed}-{batch}")
        prefill_bound = -(-batch * a.context // a.max_num_batched_tokens) + 1
        tokens = prefill_bound + a.warmup + a.steps + a.profile_steps + 2
        tokens += a.phase_steps + a.host_profile_steps
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        ids = [f"b{batch}-{i}" for i in range(batch)]
        for rid in ids:
            prompt = rng.choices(self.token_ids, k=a.context)
            self.engine.add_prompt(rid, params=params, prompt_token_ids=prompt)
            self.generated[rid] = 0
        return ids, prefill_bound

    def timed(self, num_steps: int) -> tuple[float, list[float], list[int]]:
        """Wall seconds of ``num_steps`` steps, each step's seconds, and each step's rows."""
        synchronize(self.args.device)
        start = time.perf_counter()
        ends, rows = [], []
        for _ in range(num_steps):
            rows.append(self.step())
            ends.append(time.perf_counter())
        synchronize(self.args.device)
        wall = time.perf_counter() - start
        return wall, [t1 - t0 for t0, t1 in zip([start, *ends], ends, strict=False)], rows

    def release(self, ids: list[str]) -> None:
        for rid in ids:
            self.engine.abort(rid)
            del self.generated[rid]
        while self.engine.has_unfinished():
            self.engine.step()

    def run_batch(self, batch: int, gbps: float, itemsize: int) -> dict[str, Any]:
        a = self.args
        ids, prefill_bound = self.admit(batch)
        prefill_steps = 0
        while min(self.generated[r] for r in ids) == 0 and prefill_steps <= prefill_bound:
            self.step()
            prefill_steps += 1
        rows = [self.step() for _ in range(a.warmup)]
        # Mean context over the timed steps: the prompt, what each row has generated so far,
        # and half of the timed steps' own tokens.
        context = a.context + statistics.mean(self.generated[r] for r in ids) + (a.steps - 1) / 2
        wall, gaps, timed_rows = self.timed(a.steps)
        rows += timed_rows
        step = lambda: rows.append(self.step())  # noqa: E731
        try:
            idle = profile_idle(step, a.profile_steps, a.device)
        except Exception as e:  # a profiler that cannot trace must not cost the timings
            idle = {"idle_share": None, "profile_error": f"{type(e).__name__}: {e}"}
        more: dict[str, Any] = {}
        if a.phase_steps:
            more["phase_ms"] = phase_ms(self.engine, step, a.phase_steps)
        if a.host_profile_steps and batch == max(a.batch_sizes):
            more["host_profile"] = host_profile(step, a.host_profile_steps)
        self.release(ids)
        nbytes = step_bytes(self.mc, itemsize, batch, context)
        ms = 1e3 * wall / a.steps
        floor_ms = nbytes["total"] / gbps / 1e6
        return {
            "batch": batch,
            "context_mean": context,
            "prefill_steps": prefill_steps,
            "decode_only": all(r == batch for r in rows),  # every measured step had B rows
            "ms_per_step": ms,
            "median_ms": 1e3 * statistics.median(gaps),
            "min_ms": 1e3 * min(gaps),
            "floor_ms": floor_ms,
            "x_floor": ms / floor_ms,
            "output_tok_s": batch * a.steps / wall,
            "bytes": nbytes,
            **idle,
            **more,
        }


def count_modules(model: torch.nn.Module, type_name: str) -> int:
    return sum(type(m).__name__ == type_name for m in model.modules())


def resident_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers (quantized weights' codes and scales are
    buffers), each storage once (a tied head is its embedding's table)."""
    seen: dict[int, int] = {}
    for t in (*model.parameters(), *model.buffers()):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def run(args: argparse.Namespace) -> dict[str, Any]:
    gbps = copy_gbps(args.device, args.copy_bytes or COPY_BYTES[args.device])
    bench = StepBench(args)
    itemsize = getattr(torch, args.dtype).itemsize
    mc = bench.mc
    results = []
    for batch in args.batch_sizes:
        results.append(bench.run_batch(batch, gbps, itemsize))
        print(json.dumps(results[-1]), flush=True)  # a killed run keeps what it measured
    graphs = getattr(bench.engine.runner, "graphs", None)
    return {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "dtype": args.dtype,
        "model_dir": str(bench.engine.model_dir),
        "model": {
            "model_type": mc.model_type,
            "layers": mc.num_layers,
            "hidden": mc.hidden_size,
            "q_heads": mc.num_q_heads,
            "kv_heads": mc.num_kv_heads,
            "head_size": mc.head_size,
            "vocab": mc.vocab_size,
            "tied": mc.tie_word_embeddings,
            "qk_norm": mc.qk_norm,
        },
        # FP8 projections (a checkpoint random_model.py --fp8 wrote) and --quantization int8's
        # read 1 byte a weight, not the dtype's: the floor still counts the dtype's bytes, and
        # resident_weight_bytes says what the model holds.
        "fp8_linears": count_modules(bench.engine.runner.model, "Fp8Linear"),
        "int8_linears": count_modules(bench.engine.runner.model, "Int8Linear"),
        "quantization": args.quantization,
        "resident_weight_bytes": resident_bytes(bench.engine.runner.model),
        "weight_bytes": step_bytes(mc, itemsize, 0, 0)["weights"],
        "kv_bytes_per_token": mc.kv_bytes_per_token * itemsize,
        "copy_gbps": gbps,
        "enforce_eager": args.enforce_eager,
        "graph_sizes": list(getattr(graphs, "sizes", ()) or ()),
        "steps": {"warmup": args.warmup, "timed": args.steps, "profiled": args.profile_steps},
        "context": args.context,
        "batches": results,
    }


def print_table(report: dict[str, Any]) -> None:
    m = report["model"]
    print(
        f"\n{report['device']} {report['dtype']} {m['model_type']} {m['layers']} layers "
        f"(weights {report['weight_bytes'] / 1e9:.2f} GB), copy {report['copy_gbps']:.0f} GB/s, "
        f"prompts of {report['context']}, eager {report['enforce_eager']}"
    )
    print(
        f"{'batch':>5} {'ctx':>6} {'ms/step':>8} {'median':>7} {'floor ms':>8} {'x floor':>7} "
        f"{'idle %':>6} {'tok/s':>8}"
    )
    for r in report["batches"]:
        idle = "-" if r.get("idle_share") is None else f"{100 * r['idle_share']:.1f}"
        print(
            f"{r['batch']:>5} {r['context_mean']:>6.0f} {r['ms_per_step']:>8.2f} "
            f"{r['median_ms']:>7.2f} {r['floor_ms']:>8.3f} {r['x_floor']:>7.1f} {idle:>6} "
            f"{r['output_tok_s']:>8.0f}{'' if r['decode_only'] else '  (not decode-only!)'}"
        )
    phased = [r for r in report["batches"] if "phase_ms" in r]
    if phased:
        names = ("host", "wait", "schedule", "run", "prepare", "sample", "resolve", "update",
                 "append", "detokenize", "other")  # fmt: skip
        print("host phases, median ms a step: " + " ".join(f"{n:>7}" for n in names))
        for r in phased:
            cells = " ".join(f"{r['phase_ms'].get(n, 0.0):>7.3f}" for n in names)
            print(f"  batch {r['batch']:>3}{' ' * 22}{cells}")
    for r in report["batches"]:
        if "host_profile" in r:
            print(f"cProfile of batch {r['batch']}, per step:")
            print("\n".join(r["host_profile"]))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="HF directory (random_model.py writes one)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument(
        "--quantization",
        default=EngineConfig.quantization,
        choices=get_args(get_type_hints(EngineConfig)["quantization"]),
        help="projection weights, as the engine's flag (int8 on CUDA: a Triton GEMM)",
    )
    p.add_argument("--batch-sizes", default=DEFAULT_BATCHES, help="comma list")
    p.add_argument("--context", type=int, default=512, help="prompt tokens per row")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20, help="timed decode steps per batch size")
    p.add_argument("--profile-steps", type=int, default=5)
    # The host's side: its phases timed from outside the engine (step_timer.py), and a cProfile
    # of the largest batch's steps.
    p.add_argument("--phase-steps", type=int, default=10)
    p.add_argument("--host-profile-steps", type=int, default=5)
    p.add_argument("--kv-cache-bytes", type=lambda v: int(float(v)), default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--copy-bytes", type=lambda v: int(float(v)), default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    args.dtype = args.dtype or DEFAULT_DTYPE[args.device]
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    if not args.batch_sizes or min(args.batch_sizes) < 1 or min(args.steps, args.warmup) < 0:
        p.error("--batch-sizes must be positive integers and step counts >= 0")
    if args.steps < 1 or args.max_num_batched_tokens < max(args.batch_sizes):
        p.error("--steps must be >= 1 and --max-num-batched-tokens >= the largest batch")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    report = run(args)
    print_table(report)
    write_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
