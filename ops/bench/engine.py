"""End-to-end throughput: our engine against Hugging Face transformers on one seeded workload.

    python ops/bench/engine.py --out results/engine.json        # 64 requests, ~16k in, ~8.7k out
    python ops/bench/engine.py --num-requests 6 --scale 0.1     # smoke test: under 2 min, 2 cores
    python ops/bench/engine.py --systems ours,hf-cb --hf-sequential
    python ops/bench/engine.py --device cuda --model DIR --kv-cache-bytes 8e9   # GPU, bf16
    python ops/bench/engine.py --workload nano-vllm --num-requests 256   # nano-vllm's bench.py

Every system runs the same requests (random token ids, forced output lengths, greedy) one after
another in this process, on the same fp32 weights and torch thread count:

- ``ours``: `LLMEngine`, every request added at once, stepped to completion, ``ignore_eos``.
- ``hf-static``: HF ``generate`` on left-padded batches of 8 in workload order; each batch runs to
  its longest forced length, and only each request's own tokens count as output.
- ``hf-cb``: HF continuous batching (`continuous_batching_context_manager`) on its paged cache,
  with the same KV bytes, step token budget and batch size cap as ours.
- ``hf-seq`` (``--hf-sequential``): HF ``generate`` one request at a time.

EOS never ends a request: ours ignores it; HF generate runs with ``eos_token_id=None`` (nothing
stops, nothing is masked, so greedy logits match ``ignore_eos``; ``min_new_tokens`` is set to the
length too) and HF continuous batching gets ``eos_token_id=-1`` per request (its "no EOS").
Every system's output lengths are checked against the forced lengths.

Throughput counts useful tokens only (the workload's prompt and forced output tokens), so every
system is measured on the same work. Model FLOPs of that work: ``2 * non-embedding params`` per
processed token, ``2 * vocab * hidden`` per sampled token, plus ``4 * layers * q_heads *
head_size * context`` of attention per processed token; shown against a measured matmul in the
same dtype.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import platform
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

# Run as a script: put the repository first so `worker` imports without an install.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from worker.engine.config import (
    DEFAULT_CPU_KV_BYTES,
    CacheConfig,
    EngineConfig,
    SchedulerConfig,
)
from worker.models.config import ModelConfig
from worker.models.loader import load_tokenizer, resolve_model_dir

# ours-bf16: our engine with bf16 weights and KV (AVX512-BF16 CPUs run bf16 GEMMs at ~2x fp32).
# "ours" and the HF peers take --dtype: fp32 on the CPU, bf16 on CUDA unless told otherwise.
SYSTEMS = ("ours", "ours-bf16", "hf-static", "hf-cb", "hf-seq")
OUR_DTYPES: dict[str, str | None] = {"ours": None, "ours-bf16": "bfloat16"}  # None: --dtype
DEFAULT_DTYPE = {"cpu": "float32", "cuda": "bfloat16"}
DEFAULT_SYSTEMS = "ours,hf-static,hf-cb"
MATMUL_N = 2048
PARITY_REQUESTS = 8
WARMUP_PROMPT, WARMUP_OUTPUT = 16, 4


@dataclass(frozen=True)
class RequestClass:
    name: str
    prompt_len: tuple[int, int]  # inclusive range, before --scale
    output_len: tuple[int, int]
    weight: float  # share of the requests


# Weights solve 64 * E[prompt] ~ 16k and 64 * E[output] ~ 8.6k: 38/11/15 requests of each class
# expect 16.3k prompt and 8.7k output tokens.
CLASSES = (
    RequestClass("chat", (16, 64), (16, 64), 0.60),
    RequestClass("long-prompt", (512, 2048), (16, 64), 0.17),
    RequestClass("long-gen", (32, 64), (256, 640), 0.23),
)
# nano-vllm's bench.py: prompt and output lengths each uniform in 100-1024, EOS ignored.
NANO_VLLM = (RequestClass("nano-vllm", (100, 1024), (100, 1024), 1.0),)
WORKLOADS = {"mix": CLASSES, "nano-vllm": NANO_VLLM}


@dataclass(frozen=True)
class BenchRequest:
    request_id: str
    kind: str
    prompt_ids: tuple[int, ...]
    output_len: int  # forced: exactly this many tokens are generated


@dataclass
class SystemResult:
    name: str
    wall_s: float
    outputs: dict[str, list[int]]  # request id -> generated token ids (its forced length)
    extra: dict[str, Any] = field(default_factory=dict)


# -- workload --------------------------------------------------------------------------------------


def class_counts(n: int, weights: Sequence[float]) -> list[int]:
    """Requests per class: largest remainder, so the mix is exact rather than sampled."""
    total = sum(weights)
    raw = [n * w / total for w in weights]
    counts = [int(r) for r in raw]
    by_remainder = sorted(range(len(raw)), key=lambda i: raw[i] - counts[i], reverse=True)
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    return counts


def scaled_range(bounds: tuple[int, int], scale: float) -> tuple[int, int]:
    lo = max(1, round(bounds[0] * scale))
    return lo, max(lo, round(bounds[1] * scale))


def normal_token_ids(tokenizer: Any, vocab_size: int) -> list[int]:
    """Ids of ordinary tokens: in the model's vocab, not special, not added (chat markers)."""
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    return [t for t in range(min(len(tokenizer), vocab_size)) if t not in special]


def stratified(rng: random.Random, bounds: tuple[int, int], k: int) -> list[int]:
    """``k`` lengths, one from each of ``k`` equal slices of the range, shuffled: totals stay
    near their expectation whatever the seed (plain uniform draws of the 11 long prompts swing
    the prompt total by +-1.5k tokens)."""
    lo, hi = bounds
    span = hi - lo + 1
    values = [lo + int((j + rng.random()) * span / k) for j in range(k)]
    rng.shuffle(values)
    return values


def make_workload(
    n: int,
    seed: int,
    scale: float,
    token_ids: Sequence[int],
    classes: Sequence[RequestClass] = CLASSES,
) -> list[BenchRequest]:
    rng = random.Random(seed)
    counts = class_counts(n, [c.weight for c in classes])
    lengths = {
        c.name: list(
            zip(
                stratified(rng, scaled_range(c.prompt_len, scale), k),
                stratified(rng, scaled_range(c.output_len, scale), k),
                strict=True,
            )
        )
        for c, k in zip(classes, counts, strict=True)
    }
    kinds = [c.name for c, k in zip(classes, counts, strict=True) for _ in range(k)]
    rng.shuffle(kinds)
    requests = []
    for i, kind in enumerate(kinds):
        prompt_len, output_len = lengths[kind].pop()
        prompt = tuple(rng.choices(token_ids, k=prompt_len))
        requests.append(BenchRequest(f"r{i}", kind, prompt, output_len))
    return requests


def workload_totals(
    workload: Sequence[BenchRequest], classes: Sequence[RequestClass] = CLASSES
) -> dict[str, Any]:
    prompt = sum(len(r.prompt_ids) for r in workload)
    output = sum(r.output_len for r in workload)
    per_class = {c.name: sum(r.kind == c.name for r in workload) for c in classes}
    return {
        "num_requests": len(workload),
        "prompt_tokens": prompt,
        "output_tokens": output,
        "total_tokens": prompt + output,
        "requests_per_class": per_class,
        "max_prompt_len": max(len(r.prompt_ids) for r in workload),
        "max_output_len": max(r.output_len for r in workload),
        "prompt_lens": [len(r.prompt_ids) for r in workload],
        "output_lens": [r.output_len for r in workload],
    }


# -- FLOPs and the ceiling -------------------------------------------------------------------------


def non_embedding_params(mc: ModelConfig) -> int:
    h, d = mc.hidden_size, mc.head_size
    qkv = h * (mc.num_q_heads + 2 * mc.num_kv_heads) * d
    o = mc.num_q_heads * d * h
    mlp = 3 * h * mc.intermediate_size
    return mc.num_layers * (qkv + o + mlp + 2 * h) + h  # + the RMSNorm weights


def useful_flops(mc: ModelConfig, workload: Sequence[BenchRequest]) -> dict[str, float]:
    """FLOPs of the workload itself, whatever a system recomputes or pads on top."""
    # The last sampled token is never fed back: prompt + output - 1 tokens pass the layers.
    processed = [len(r.prompt_ids) + r.output_len - 1 for r in workload]
    sampled = sum(r.output_len for r in workload)
    linear = 2 * non_embedding_params(mc) * sum(processed)
    lm_head = 2 * mc.vocab_size * mc.hidden_size * sampled
    # QK^T and AV, 2 FLOPs per multiply-add each, over the t keys token t sees.
    attn_per_key = 4 * mc.num_layers * mc.num_q_heads * mc.head_size
    attention = attn_per_key * sum(t * (t + 1) // 2 for t in processed)
    return {
        "linear": float(linear),
        "lm_head": float(lm_head),
        "attention": float(attention),
        "total": float(linear + lm_head + attention),
    }


def matmul_gflops(
    n: int = MATMUL_N, reps: int = 5, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> float:
    """``n^3`` matmul, median of ``reps`` after one warm-up: the device's practical ceiling."""
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.matmul(a, b)
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        torch.matmul(a, b)
        sync()
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times) / 1e9


# -- the systems -----------------------------------------------------------------------------------


def warmup_prompt(token_ids: Sequence[int]) -> list[int]:
    return random.Random(-1).choices(token_ids, k=WARMUP_PROMPT)


def run_ours(
    args: argparse.Namespace, workload: Sequence[BenchRequest], warm: list[int], name: str = "ours"
) -> SystemResult:
    from worker.engine.llm_engine import LLMEngine
    from worker.engine.sampling_params import SamplingParams

    engine = LLMEngine(
        EngineConfig(
            model=str(args.model_dir),
            device=args.device,
            dtype=OUR_DTYPES[name] or args.dtype,  # type: ignore[arg-type]
            num_threads=args.threads,
            linear_backend=args.linear_backend,
            enforce_eager=args.enforce_eager,
            cache=CacheConfig(memory_bytes=args.kv_cache_bytes),
            scheduler=SchedulerConfig(
                max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens
            ),
        )
    )

    def params(n: int) -> SamplingParams:
        return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)

    engine.add_prompt("warmup", params=params(WARMUP_OUTPUT), prompt_token_ids=warm)
    while engine.has_unfinished():
        engine.step()
    preemptions_before = engine.scheduler.num_preemptions
    computed = [0, 0]  # steps, tokens through the model (recomputation after preemption included)
    schedule = engine.scheduler.schedule

    def counting_schedule() -> Any:
        decision = schedule()
        if not decision.is_empty:
            computed[0] += 1
            computed[1] += decision.num_batched_tokens
        return decision

    engine.scheduler.schedule = counting_schedule  # type: ignore[method-assign]
    outputs: dict[str, list[int]] = {r.request_id: [] for r in workload}
    start = time.perf_counter()
    for r in workload:
        engine.add_prompt(r.request_id, params=params(r.output_len), prompt_token_ids=r.prompt_ids)
    while engine.has_unfinished():
        for out in engine.step():
            outputs[out.request_id].extend(out.new_token_ids)
    wall = time.perf_counter() - start
    extra = {
        "steps": computed[0],
        "computed_tokens": computed[1],
        "preemptions": engine.scheduler.num_preemptions - preemptions_before,
        "kv_cache_tokens": engine.runner.num_blocks * engine.config.cache.block_size,
    }
    return SystemResult(name, wall, outputs, extra)


def load_hf(model_dir: Path, dtype: str = "float32", device: str = "cpu") -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=getattr(torch, dtype), attn_implementation="sdpa"
    )
    model = model.to(device).eval()
    # No EOS: nothing stops early and no logit is masked, as with our ignore_eos. (Keeping EOS
    # and forcing min_new_tokens would mask it, so greedy picks would differ from ours at EOS.)
    model.generation_config.eos_token_id = None
    return model


def left_padded(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids, mask


def hf_generate(model: Any, prompts: Sequence[Sequence[int]], length: int) -> list[list[int]]:
    """Greedy, exactly ``length`` new tokens for each prompt of one left-padded batch."""
    pad = model.generation_config.pad_token_id
    ids, mask = left_padded(prompts, 0 if pad is None else int(pad))
    ids, mask = ids.to(model.device), mask.to(model.device)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=length,
            min_new_tokens=length,
            do_sample=False,
        )
    new = out[:, ids.shape[1] :]
    if new.shape[1] != length:
        raise RuntimeError(f"HF generate made {new.shape[1]} tokens, not the forced {length}")
    return [row.tolist() for row in new]


def run_hf_static(
    args: argparse.Namespace, model: Any, workload: Sequence[BenchRequest], warm: list[int]
) -> SystemResult:
    hf_generate(model, [warm, warm[:-3]], WARMUP_OUTPUT)
    outputs: dict[str, list[int]] = {}
    generated = 0  # padding included: every row runs to its batch's longest length
    size = args.hf_static_batch_size
    start = time.perf_counter()
    for i in range(0, len(workload), size):
        batch = workload[i : i + size]
        length = max(r.output_len for r in batch)
        rows = hf_generate(model, [r.prompt_ids for r in batch], length)
        generated += length * len(batch)
        for r, row in zip(batch, rows, strict=True):
            outputs[r.request_id] = row[: r.output_len]
    wall = time.perf_counter() - start
    extra = {"batch_size": size, "generated_tokens_incl_padding": generated}
    return SystemResult("hf-static", wall, outputs, extra)


def run_hf_sequential(
    args: argparse.Namespace, model: Any, workload: Sequence[BenchRequest], warm: list[int]
) -> SystemResult:
    hf_generate(model, [warm], WARMUP_OUTPUT)
    outputs: dict[str, list[int]] = {}
    start = time.perf_counter()
    for r in workload:
        outputs[r.request_id] = hf_generate(model, [r.prompt_ids], r.output_len)[0]
    return SystemResult("hf-seq", time.perf_counter() - start, outputs)


def hf_cb_configs(args: argparse.Namespace, model: Any, max_output: int) -> tuple[Any, Any]:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    mc = ModelConfig.from_dir(args.model_dir)
    itemsize = getattr(torch, args.dtype).itemsize
    block_bytes = mc.kv_bytes_per_token * itemsize * args.hf_cb_page_size
    cb = ContinuousBatchingConfig(
        page_size=args.hf_cb_page_size,
        num_blocks=max(1, args.kv_cache_bytes // block_bytes),  # the same KV bytes as ours
        max_batch_tokens=args.hf_cb_max_batch_tokens or args.max_num_batched_tokens,
        max_requests_per_batch=args.max_num_seqs,
        # Random prompts share no prefix: hashing is pure cost (ours keeps its prefix cache on,
        # the default, and pays for hashing full blocks too).
        allow_block_sharing=args.hf_cb_prefix_sharing,
    )
    pad = model.generation_config.pad_token_id
    gen = GenerationConfig(
        do_sample=False, max_new_tokens=max_output, eos_token_id=-1, pad_token_id=pad
    )
    return gen, cb


def collect_cb(manager: Any, ids: set[str], timeout_s: float) -> dict[str, Any]:
    """Wait for every request of ``ids`` to finish; fail loudly on errors or a dead loop."""
    done: dict[str, Any] = {}
    deadline = time.perf_counter() + timeout_s
    while len(done) < len(ids):
        result = manager.get_result(timeout=1.0)
        if result is None:
            if not manager.is_running() or time.perf_counter() > deadline:
                raise RuntimeError(
                    f"HF continuous batching stopped with {len(done)}/{len(ids)} done"
                )
            continue
        if result.error is not None:
            raise RuntimeError(f"HF continuous batching failed {result.request_id}: {result.error}")
        if result.is_finished() and result.request_id in ids:
            done[result.request_id] = result
    return done


def run_hf_cb(
    args: argparse.Namespace, model: Any, workload: Sequence[BenchRequest], warm: list[int]
) -> SystemResult:
    max_output = max(r.output_len for r in workload)
    gen, cb = hf_cb_configs(args, model, max_output)
    if args.hf_cb_attn == "paged|eager":
        model.set_attn_implementation("paged|eager")
    ids = {r.request_id for r in workload}
    with model.continuous_batching_context_manager(
        generation_config=gen, continuous_batching_config=cb, block=True, timeout=60
    ) as manager:
        manager.add_request(
            warm, request_id="warmup", max_new_tokens=WARMUP_OUTPUT, eos_token_id=-1
        )
        collect_cb(manager, {"warmup"}, args.hf_cb_timeout_s)
        attn = model.config._attn_implementation
        start = time.perf_counter()
        for r in workload:
            manager.add_request(
                list(r.prompt_ids),
                request_id=r.request_id,
                max_new_tokens=r.output_len,
                eos_token_id=-1,  # RequestState keeps no EOS id below 0: none can stop it
            )
        results = collect_cb(manager, ids, args.hf_cb_timeout_s)
        wall = time.perf_counter() - start
        resolved = manager.continuous_batching_config
        extra = {
            "attn_implementation": attn,
            "page_size": resolved.page_size,
            "num_blocks": resolved.num_blocks,
            "max_batch_tokens": resolved.max_batch_tokens,
            "max_requests_per_batch": resolved.max_requests_per_batch,
            "prefix_sharing": resolved.allow_block_sharing,
        }
    model.set_attn_implementation("sdpa")
    outputs = {rid: list(res.generated_tokens) for rid, res in results.items()}
    return SystemResult("hf-cb", wall, outputs, extra)


# -- reporting -------------------------------------------------------------------------------------


def check_lengths(result: SystemResult, workload: Sequence[BenchRequest]) -> None:
    wrong = [
        (r.request_id, len(result.outputs.get(r.request_id, [])), r.output_len)
        for r in workload
        if len(result.outputs.get(r.request_id, [])) != r.output_len
    ]
    if wrong:
        raise RuntimeError(f"{result.name}: output lengths differ from forced ones: {wrong[:5]}")


def parity(
    a: SystemResult, b: SystemResult, workload: Sequence[BenchRequest], n: int
) -> dict[str, Any]:
    """Exact greedy matches over the first ``n`` requests, and where each mismatch starts."""
    first_diff: dict[str, int] = {}
    for r in workload[:n]:
        x, y = a.outputs[r.request_id], b.outputs[r.request_id]
        if x != y:
            first_diff[r.request_id] = next(
                i for i, (p, q) in enumerate(zip(x, y, strict=True)) if p != q
            )
    checked = min(n, len(workload))
    return {"checked": checked, "equal": checked - len(first_diff), "first_diff_at": first_diff}


def summarize(
    result: SystemResult, totals: dict[str, Any], flops: dict[str, float], ceiling: float
) -> dict[str, Any]:
    gflops = flops["total"] / result.wall_s / 1e9
    return {
        "wall_s": result.wall_s,
        "output_tokens": totals["output_tokens"],
        "output_tok_s": totals["output_tokens"] / result.wall_s,
        "total_tok_s": totals["total_tokens"] / result.wall_s,
        "model_gflop_s": gflops,
        "pct_of_matmul": 100 * gflops / ceiling,
        **result.extra,
    }


def print_table(report: dict[str, Any]) -> None:
    t, env = report["workload"], report["environment"]
    print(
        f"\n{env['cpu_model']}  {env.get('device', 'cpu')}  torch {env['torch']}  "
        f"{env['threads']} threads  "
        f"{report['config']['dtype']} matmul {report['matmul_gflop_s']:.1f} GFLOP/s  "
        f"bf16 matmul {report.get('matmul_bf16_gflop_s', 0.0):.1f} GFLOP/s  "
        f"load avg {env['loadavg_start']}"
    )
    print(
        f"{t['num_requests']} requests {t['requests_per_class']}: {t['prompt_tokens']} prompt + "
        f"{t['output_tokens']} output tokens, {report['useful_gflop']:.1f} GFLOP of model work"
    )
    head = f"{'system':<10} {'wall s':>8} {'out tok/s':>10} {'tot tok/s':>10} {'GFLOP/s':>8}"
    print(head + f" {'%matmul':>8} {'ours x':>7}")
    for name, s in report["systems"].items():
        ratio = s.get("ours_speedup")
        print(
            f"{name:<10} {s['wall_s']:>8.2f} {s['output_tok_s']:>10.1f} {s['total_tok_s']:>10.1f} "
            f"{s['model_gflop_s']:>8.2f} {s['pct_of_matmul']:>8.1f} "
            f"{'' if ratio is None else f'{ratio:.2f}':>7}"
        )
    ours = report["systems"].get("ours")
    if ours:
        print(
            f"ours: {ours['steps']} steps, {ours['preemptions']} preemptions, "
            f"{ours['computed_tokens']} tokens computed, KV {ours['kv_cache_tokens']} tokens"
        )
    for peer, p in report["parity_vs_ours"].items():
        diffs = p["first_diff_at"] or "none"
        print(
            f"greedy parity ours vs {peer}: {p['equal']}/{p['checked']} equal; diverge at {diffs}"
        )


def environment(threads: int, device: str = "cpu") -> dict[str, Any]:
    import transformers

    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "threads": threads,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "systems_run_on": "a fresh thread each (see in_worker_thread)",
    }


# -- main ------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="HF directory or .gguf; default the bundled SmolLM2-135M")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="weights and KV of ours and the HF peers; default float32 on cpu, bfloat16 on cuda",
    )
    p.add_argument(
        "--linear-backend",
        choices=("auto", "torch", "onednn"),
        default="auto",
        help="ours' CPU projections (EngineConfig.linear_backend)",
    )
    p.add_argument(
        "--keep-going", action="store_true", help="record a failing system and run the rest"
    )
    p.add_argument("--systems", default=DEFAULT_SYSTEMS, help=f"comma list of {', '.join(SYSTEMS)}")
    p.add_argument("--hf-sequential", action="store_true", help="also run hf-seq")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="mix")
    p.add_argument("--enforce-eager", action="store_true", help="ours: no CUDA graphs")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every length range")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--kv-cache-bytes", type=lambda v: int(float(v)), default=DEFAULT_CPU_KV_BYTES)
    p.add_argument("--max-num-seqs", type=int, default=SchedulerConfig.max_num_seqs)
    p.add_argument(
        "--max-num-batched-tokens", type=int, default=SchedulerConfig.max_num_batched_tokens
    )
    p.add_argument("--hf-static-batch-size", type=int, default=8)
    p.add_argument("--hf-cb-attn", choices=("sdpa", "paged|eager"), default="sdpa")
    p.add_argument("--hf-cb-page-size", type=int, default=256)
    p.add_argument("--hf-cb-max-batch-tokens", type=int, help="default: --max-num-batched-tokens")
    p.add_argument("--hf-cb-prefix-sharing", action="store_true")
    p.add_argument("--hf-cb-timeout-s", type=float, default=3600.0)
    p.add_argument("--parity-requests", type=int, default=PARITY_REQUESTS)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    args.dtype = args.dtype or DEFAULT_DTYPE[args.device]
    if args.hf_sequential and "hf-seq" not in args.systems:
        args.systems.append("hf-seq")
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown or not args.systems:
        p.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    return args


Runner = Callable[[argparse.Namespace, Any, Sequence[BenchRequest], list[int]], SystemResult]
HF_RUNNERS: dict[str, Runner] = {
    "hf-static": run_hf_static,
    "hf-cb": run_hf_cb,
    "hf-seq": run_hf_sequential,
}


T = TypeVar("T")


def in_worker_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` on a fresh thread, as HF continuous batching runs its loop, so every system
    gets the same OpenMP behaviour. libgomp spins 300k rounds at a barrier, but only 1k once it
    manages more threads than CPUs (as soon as a second thread has a team). With other
    processes on the 2 cores, full spinning made main-thread systems 10-20x slower (a toy MLP
    loop: 12.4 s on the main thread, 1.6 s on a second thread, 1.5 s with OMP_WAIT_POLICY=passive)
    while HF's own thread was unaffected."""
    box: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            box.append(fn())
        except BaseException as e:  # re-raised on the caller's thread
            errors.append(e)

    thread = threading.Thread(target=target, name="bench-system")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return box[0]


def run_systems(
    args: argparse.Namespace, workload: Sequence[BenchRequest], warm: list[int]
) -> tuple[dict[str, SystemResult], dict[str, str]]:
    """Each system's result, and with ``--keep-going`` the error of each system that failed."""
    results: dict[str, SystemResult] = {}
    failed: dict[str, str] = {}
    hf_model: Any = None
    for name in args.systems:
        print(f"running {name} ...", flush=True)
        try:
            if name in HF_RUNNERS:
                if hf_model is None:
                    hf_model = load_hf(args.model_dir, args.dtype, args.device)
                run = functools.partial(HF_RUNNERS[name], args, hf_model, workload, warm)
            else:
                run = functools.partial(run_ours, args, workload, warm, name)
            results[name] = in_worker_thread(run)
            check_lengths(results[name], workload)
        except Exception as e:
            if not args.keep_going:
                raise
            failed[name] = f"{type(e).__name__}: {e}"
            print(f"  {name} FAILED: {failed[name]}", flush=True)
            results.pop(name, None)
            continue
        gc.collect()  # drop our engine's KV pool before the next system allocates its own
        print(f"  {name}: {results[name].wall_s:.2f} s", flush=True)
    return results, failed


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)  # every peer, in this process and its CB thread
    torch.manual_seed(args.seed)
    args.model_dir = resolve_model_dir(args.model)
    mc = ModelConfig.from_dir(args.model_dir)
    token_ids = normal_token_ids(load_tokenizer(args.model_dir), mc.vocab_size)
    classes = WORKLOADS[args.workload]
    workload = make_workload(args.num_requests, args.seed, args.scale, token_ids, classes)
    totals = workload_totals(workload, classes)
    print(
        f"workload: {totals['num_requests']} requests {totals['requests_per_class']}, "
        f"{totals['prompt_tokens']} prompt + {totals['output_tokens']} output tokens",
        flush=True,
    )
    env = environment(args.threads, args.device)
    # Each system is held against a matmul in its own dtype (n = 8192 fills an H200; 2048 a CPU).
    n = 8192 if args.device == "cuda" else MATMUL_N
    ceiling = matmul_gflops(n, dtype=getattr(torch, args.dtype), device=args.device)
    ceiling_bf16 = 0.0
    if "ours-bf16" in args.systems:
        ceiling_bf16 = matmul_gflops(n, dtype=torch.bfloat16, device=args.device)
    flops = useful_flops(mc, workload)
    results, failed = run_systems(args, workload, warmup_prompt(token_ids))
    systems = {
        name: summarize(r, totals, flops, ceiling_bf16 if name == "ours-bf16" else ceiling)
        for name, r in results.items()
    }
    if "ours" in systems:
        for s in systems.values():
            s["ours_speedup"] = systems["ours"]["output_tok_s"] / s["output_tok_s"]
    parity_report = {
        name: parity(results["ours"], r, workload, args.parity_requests)
        for name, r in results.items()
        if name != "ours" and "ours" in results
    }
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    report = {
        "config": config,
        "environment": env,
        "workload": totals,
        "classes": [asdict(c) for c in classes],
        "matmul_gflop_s": ceiling,
        "matmul_bf16_gflop_s": ceiling_bf16,
        "useful_gflop": flops["total"] / 1e9,
        "flops": flops,
        "non_embedding_params": non_embedding_params(mc),
        "systems": systems,
        "parity_vs_ours": parity_report,
        "failed": failed,
    }
    report = json.loads(json.dumps(report))  # what --out holds: tuples become lists
    print_table(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
