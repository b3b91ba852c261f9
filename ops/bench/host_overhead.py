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
engine; `step_timer.py`): ``schedule`` and ``update`` of the scheduler, ``prepare`` and ``run``
of the runner, the sampler, and `RequestState.append` or ``emit`` (stop checks and
detokenization, one call per request; ``detokenize`` is its `IncrementalDetokenizer.add_tokens`
part). ``forward`` is run - prepare: the layers, and the runner's own Python around them (batch
order, gathering the sampling rows and the LM head's projection into `LogitsBuffer`). ``other``
is the rest of the caller's step: the engine's per-request glue (sampling requests, outputs)
and freeing the step's tensors. ``host_ms`` is the step less forward and sampling:
scheduling, input preparation and output processing on the critical path, what issue 19's
goal bounds (1 ms at batch 256).

``--overlap-steps`` picks the loop ("auto" is "off" on the CPU: the plain loop, every phase one
after another on the calling thread, all on the critical path). ``thread``: the overlapped loop
(`overlap.py`) with prepare, forward and sampling on its step thread, which stands for the
device. The caller schedules and launches step N+1 before it waits for step N's ids, then
resolves them and does N's output processing (scheduler update, the deferred ``emit``:
detokenizing, stop strings) while N+1 computes; all of that leaves the critical path as long as
it is shorter than the compute. There the step is the caller's period, ``wait`` its time blocked
on the step thread, and ``device_idle`` the step thread's idle time between two computes: the
host work it waited for, measured on the thread that waits. ``host_ms`` is then
``device_idle`` plus the step thread's input preparation (on CUDA the launch prepares on the
host, ahead of the device, so this overstates a GPU's wait). ``async`` on the CPU runs each op
as it is called, so it only reorders the loop. Compare loops in separate processes
(`overlap_loop.py` says why).

``--clock thread`` times each phase (and the step) in CPU time of the thread it runs on
(`time.thread_time`) instead of wall time: on a shared machine the host phases' CPU time moves
far less with other processes' load. Forward and sampling then also count the OpenMP threads'
spinning on the caller; the thread loop, which waits on another thread, is refused.

What the wrappers cost: each reads the clock twice, and the per-request ones
(`step_timer.PER_ROW_PARTS`, two a row; their cost is measured there) add ~1 ms of thread time
at batch 256 to the phases and the host total they time. ``--coarse`` leaves them out:
``host_ms`` is then the step's true host cost, and emit and detokenizing are counted in
``other``.

``--stub-device`` (`host_stub.py`): the layers, the LM head and the sampler's ids are fixed
answers, so the step is the engine's host work alone, on caches the CPU forward did not evict;
the fixed ids' own cost (a tensor of ids) is in ``sample``. ``--device-ms D`` adds a model of a
device whose step takes D ms, run as CUDA runs it (`host_stub.StubDevice`: the forward enqueues,
the host sleeps where it reads the ids). ``device_idle`` is then that device's idle time between
two steps, and ``host_ms`` is that: the host's work on the critical path, in any loop. With
``--overlap-steps async`` (the GPU's default loop) it is what of the host's work a GPU of that
step time would wait for. Use ``--clock wall``: the device's time passes asleep.
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args, get_type_hints

import torch

# Run as a script, this folder is sys.path[0] and its kernels.py would shadow the kernels package.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ops.bench.common import CLOCKS
from ops.bench.engine import environment, in_worker_thread, normal_token_ids
from ops.bench.host_stub import StubDevice, stub_device_work
from ops.bench.random_model import write_random_model
from ops.bench.step_timer import StepTimer, instrumented
from worker.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine.overlap import overlap_mode
from worker.engine.sampling_params import SamplingParams
from worker.models.loader import resolve_model_dir

# (key, row label) in step order; "detokenize" is the part of "append" spent in the detokenizer.
PHASES = (
    ("schedule", "schedule"),
    ("prepare", "input preparation (ModelRunner.prepare)"),
    ("forward", "forward (layers + logits)"),
    ("sample", "sampling"),
    ("resolve", "overlapped: resolve (ids joined, EOS/length ends)"),
    ("update", "output: scheduler update"),
    ("append", "output: RequestState.append / emit"),
    ("detokenize", "  of which detokenize"),
    ("other", "other step glue"),
    ("wait", "caller waits for the step thread"),
    ("device_idle", "device idle between steps (--device-ms: the stub's; else the step thread's)"),
)
# What runs after the next step was launched, while it computes, by loop; on the CPU the async
# launch runs the step's ops as they are called, so only the thread mode hides anything.
OFF_PATH = {
    "thread": ("schedule", "resolve", "update", "append", "detokenize", "other", "wait"),
}


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


def decode_batch_engine(
    model_dir: Path, batch: int, prompt_len: int, decode_steps: int, threads: int, **config: Any
) -> tuple[LLMEngine, int]:
    """A CPU fp32 engine with room for ``batch`` requests of ``prompt_len`` tokens to decode
    together for ``decode_steps`` steps after their prefill, and the ``max_tokens`` that takes
    (``config``: more `EngineConfig` fields)."""
    budget = max(512, batch)  # the default step budget, raised to fit one decode per request
    # The first prompts decode, first in each step, while the rest prefill in what is left of
    # the budget: they must outlast every prefill (1,024 steps at 256 prompts of 1,024 tokens).
    prefill_steps = math.ceil(batch * prompt_len / max(budget - batch, 16))
    max_tokens = prefill_steps + decode_steps
    blocks = batch * math.ceil((prompt_len + max_tokens) / 16) + 1
    engine = LLMEngine(
        EngineConfig(
            model=str(model_dir),
            device="cpu",
            dtype="float32",
            num_threads=threads,
            cache=CacheConfig(block_size=16, num_blocks=blocks),
            scheduler=SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=budget),
            **config,
        )
    )
    return engine, max_tokens


def measure(args: argparse.Namespace, model_dir: Path, batch: int) -> dict[str, Any]:
    """Median ms per phase over ``args.steps`` steps in which all ``batch`` requests decode."""
    engine, max_tokens = decode_batch_engine(
        model_dir,
        batch,
        args.prompt_len,
        args.warmup + args.steps + 4,  # nobody finishes while timed
        args.threads,
        attention_backend=args.backend,
        overlap_steps=args.overlap_steps,
    )
    rng = random.Random(args.seed)
    vocab = normal_token_ids(engine.tokenizer, engine.model_config.vocab_size)
    for i in range(batch):
        prompt = rng.choices(vocab, k=args.prompt_len)
        params = request_params(i, args, max_tokens)
        engine.add_prompt(f"r{i}", params=params, prompt_token_ids=prompt)
    if args.stub_device:  # 997 ids (a prime): rows and steps get different tokens
        ids = random.Random(args.seed).sample(vocab, 997)
        device = stub_device_work(engine, ids, device_s=args.device_ms / 1e3)
    else:
        device = None
    loop = overlap_mode(engine.config, engine.device)
    return summarise(time_steps(engine, args, batch, device), batch, loop, device is not None)


def time_steps(
    engine: LLMEngine, args: argparse.Namespace, batch: int, device: StubDevice | None = None
) -> StepTimer:
    """Step until ``args.steps`` all-decode steps (after ``args.warmup`` of them) are timed;
    with a stub ``device``, its idle time in each call is the call's ``device_idle``."""
    clock = CLOCKS[args.clock]
    timer = StepTimer(clock)
    steady = 0  # consecutive steps in which every request decodes
    with instrumented(engine, timer, per_row=not args.coarse):
        while len(timer.steps) < args.steps:
            start = clock()
            engine.step()
            step_s = clock() - start
            # All decode when all run and the step computed one token each (the overlapped
            # loop returns the step before; its steady state starts one call later).
            all_decode = len(engine.scheduler.running) == batch == engine.last_num_batched_tokens
            steady = steady + 1 if all_decode else 0
            kept = len(timer.steps)
            timer.end_step(step_s, keep=steady > args.warmup)
            if device is not None:
                idle_s = device.take_idle()
                if len(timer.steps) > kept:  # the device's measure, not the step thread's
                    timer.steps[-1]["device_idle"] = idle_s
            if not engine.has_unfinished():
                raise RuntimeError("requests finished before the timed steps were done")
    return timer


def summarise(timer: StepTimer, batch: int, loop: str, device: bool = False) -> dict[str, Any]:
    keys = [k for k, _ in PHASES] + ["step"]
    ms = {k: 1e3 * statistics.median(s.get(k, 0.0) for s in timer.steps) for k in keys}
    named = [step_s["step"] - step_s["other"] for step_s in timer.steps]
    # Scheduling, input preparation and output processing on the critical path: the step less
    # forward and sampling. In the thread mode the step is the caller's period, which the
    # step thread's compute and its idle time make up.
    host = [s["step"] - s["forward"] - s.get("sample", 0.0) for s in timer.steps]
    if loop == "thread":  # the step thread's own host work, and its wait for the caller's
        host = [s.get("prepare", 0.0) + s.get("device_idle", 0.0) for s in timer.steps]
    if device:  # what the stub device waited for, whatever the loop
        host = [s.get("device_idle", 0.0) for s in timer.steps]
    off_path = OFF_PATH.get(loop, ())
    return {
        "batch": batch,
        "loop": loop,
        "steps": len(timer.steps),
        "median_ms": ms,
        "host_ms": 1e3 * statistics.median(host),
        "step_ms_all": [round(1e3 * s["step"], 3) for s in timer.steps],
        # The caller's named phases over its step: near 1 when they are all there is to it.
        "named_share_of_step": sum(named) / sum(s["step"] for s in timer.steps),
        "host_share": 1.0 - ms["forward"] / ms["step"],  # what overlapping the host could hide
        "critical_path": [k for k, _ in PHASES if k not in off_path],
        "tokens_per_s": batch / (ms["step"] / 1e3),
    }


def markdown(report: dict[str, Any]) -> str:
    runs = report["batches"]
    off_path = {k for k, _ in PHASES if all(k not in r["critical_path"] for r in runs)}

    def row(label: str, cells: list[str], critical: str = "") -> str:
        return f"| {label} | {critical} | " + " | ".join(cells) + " |"

    lines = [row("phase (median ms per step)", [f"B={r['batch']}" for r in runs], "critical path")]
    lines.append("| --- | --- |" + " ---: |" * len(runs))
    lines += [
        row(label, [f"{r['median_ms'][k]:.2f}" for r in runs], "no" if k in off_path else "yes")
        for k, label in PHASES
        if any(r["median_ms"][k] for r in runs)
    ]
    lines += [
        row(
            "**host on the critical path** (--device-ms: device idle; thread: prepare + idle; "
            "else step - forward - sample)",
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
    loops = get_args(get_type_hints(EngineConfig)["overlap_steps"])
    p.add_argument("--overlap-steps", choices=loops, default=EngineConfig.overlap_steps)
    p.add_argument("--sampling", choices=("greedy", "mixed"), default="greedy")
    p.add_argument(
        "--clock",
        choices=tuple(CLOCKS),
        default="wall",
        help="thread: CPU time of the thread each phase runs on (plain and async loops only)",
    )
    p.add_argument("--min-tokens", action="store_true", help="min_tokens = max_tokens: EOS masked")
    p.add_argument(
        "--coarse",
        action="store_true",
        help="no per-request wrappers (step_timer.PER_ROW_PARTS): true host totals, "
        "emit and detokenize counted in other step glue",
    )
    p.add_argument(
        "--stub-device",
        action="store_true",
        help="layers, LM head and sampled ids are fixed answers (host_stub.py): the host's own "
        "work, without the CPU forward's 50 MB of logits evicting its caches",
    )
    p.add_argument(
        "--device-ms",
        type=float,
        default=0.0,
        help="with --stub-device: a device whose step takes this long (host_stub.StubDevice); "
        "host_ms is its idle time per step",
    )
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
    if args.clock == "thread" and args.overlap_steps == "thread":
        raise SystemExit("--clock thread times one thread: not the thread loop's two")
    if args.device_ms and (not args.stub_device or args.clock != "wall"):
        raise SystemExit("--device-ms models the stubbed device's step: --stub-device --clock wall")
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
