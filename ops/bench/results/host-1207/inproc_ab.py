"""Two engines in one process, stepped in turn: this checkout's and a copy of an earlier one.

`--temperature` (added in the eighteenth session, `host-zen4-1207/`): the requests' sampling
temperature; left out, `SamplingParams`' default (1.0), as the sixteenth session's runs sampled.
`host_overhead.py`'s default mix is greedy: `--temperature 0`.

This session's 2-core VM ran whole processes 1.5-2x slower at times (a `host_overhead.py` run's
unchanged phases moved together by that much between runs), so before/after processes did not
resolve changes of 10-30%. Here both engines run the same all-decode steps, stubbed device
(`host_stub.py`), alternating step by step (ABBA), so a slow spell slows both.

The earlier engine is a copy of its `worker` package renamed `worker_before` (imports rewritten):
    git worktree add /tmp/before 50a7896
    mkdir /tmp/bw && cp -r /tmp/before/worker /tmp/bw/worker_before
    grep -rl 'worker\\.' /tmp/bw/worker_before | xargs sed -i -E \\
        's/\\bworker\\.(engine|models|attention|service)/worker_before.\\1/g'
    python inproc_ab.py --before-root /tmp/bw --batches 64 256 --steps 300 --out F.json

Each step is timed in the calling thread's CPU time (`time.thread_time`): the whole
`LLMEngine.step`, stubbed forward and sampling included (0.2 ms at 256 rows, the same code in
both), so it bounds the host's share from above.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

import kernels.quant_reference  # noqa: E402, F401  (the package, before ops/bench's kernels.py)
import torch  # noqa: E402

sys.path.insert(0, str(ROOT / "ops" / "bench"))

import host_overhead as ho  # noqa: E402
from host_stub import stub_device_work  # noqa: E402


def build(
    pkg: str,
    model_dir: Path,
    batch: int,
    steps: int,
    seed: int,
    loop: str,
    temperature: float | None = None,
) -> Any:
    """An engine of package ``pkg`` (``worker`` or ``worker_before``) with ``batch`` requests
    decoding, stubbed, past its first steps."""
    engine_mod = importlib.import_module(f"{pkg}.engine.llm_engine")
    cfg = importlib.import_module(f"{pkg}.engine.config")
    params_mod = importlib.import_module(f"{pkg}.engine.sampling_params")
    max_tokens = steps + 200
    blocks = batch * ((8 + max_tokens) // 16 + 2) + 1
    engine = engine_mod.LLMEngine(
        cfg.EngineConfig(
            model=str(model_dir),
            device="cpu",
            dtype="float32",
            num_threads=2,
            cache=cfg.CacheConfig(block_size=16, num_blocks=blocks),
            scheduler=cfg.SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=512),
            overlap_steps=loop,
        )
    )
    rng = random.Random(seed)
    vocab = ho.normal_token_ids(engine.tokenizer, engine.model_config.vocab_size)
    for i in range(batch):
        sampling = {} if temperature is None else {"temperature": temperature}
        params = params_mod.SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling)
        engine.add_prompt(f"r{i}", params=params, prompt_token_ids=rng.choices(vocab, k=8))
    stub_device_work(engine, random.Random(seed).sample(vocab, 997))
    while len(engine.scheduler.running) < batch or engine.last_num_batched_tokens != batch:
        engine.step()
    for _ in range(20):
        engine.step()
    return engine


def measure(
    model_dir: Path, batch: int, steps: int, loop: str, temperature: float | None
) -> dict[str, Any]:
    engines = {"before": build("worker_before", model_dir, batch, steps, 0, loop, temperature),
               "after": build("worker", model_dir, batch, steps, 0, loop, temperature)}
    times: dict[str, list[float]] = {k: [] for k in engines}
    clock = time.thread_time
    for k in range(steps):
        order = ("before", "after") if k % 2 == 0 else ("after", "before")
        for side in order:
            start = clock()
            engines[side].step()
            times[side].append(clock() - start)
    ratios = [a / b for a, b in zip(times["after"], times["before"], strict=True)]
    return {
        "batch": batch,
        "loop": loop,
        "temperature": temperature,
        "steps": steps,
        "median_ms": {k: 1e3 * statistics.median(v) for k, v in times.items()},
        "mean_ms": {k: 1e3 * statistics.fmean(v) for k, v in times.items()},
        "median_step_ratio": statistics.median(ratios),
        "ms_all": {k: [round(1e3 * t, 4) for t in v] for k, v in times.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--before-root", type=Path, required=True)
    p.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--overlap-steps", default="off", help="the loop: off (plain) or async")
    p.add_argument("--temperature", type=float, help="0: greedy; default: SamplingParams'")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    sys.path.insert(0, str(args.before_root))
    with tempfile.TemporaryDirectory() as tmp:
        tok = ho.resolve_model_dir(None)
        model_dir = ho.write_random_model("host-overhead", tok, Path(tmp), torch.float32, "cpu")
        runs = [ho.in_worker_thread(lambda b=b: measure(
            model_dir, b, args.steps, args.overlap_steps, args.temperature))
                for b in args.batches]
    for r in runs:
        m = r["median_ms"]
        print(f"B={r['batch']}: before {m['before']:.3f} ms, after {m['after']:.3f} ms a step "
              f"(median of {r['steps']}); after/before {m['after'] / m['before']:.3f}, "
              f"median per-pair ratio {r['median_step_ratio']:.3f}")
    args.out.write_text(json.dumps({"batches": runs}, indent=1))


if __name__ == "__main__":
    main()
