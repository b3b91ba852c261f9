"""Constrained decoding's cost and validity on the bundled model, in the engine (issue 20).

    python ops/bench/constrained.py --out ops/bench/results/constrained.json
    python ops/bench/constrained.py --parts compile validity --seeds 2     # quicker

Three parts, each on the bundled SmolLM2-135M on the CPU:

- ``cost``: the same ``--batch`` chat jobs (temperature 0.7, one seed each, ``--cost-tokens``
  tokens each with ignore_eos) unconstrained and constrained to a JSON array of at least 100
  short strings (never complete within the tokens, so every step fills and applies a mask),
  alternating for ``--rounds`` rounds in one process; output tok/s of each and their ratio.
- ``compile``: parse + compile time of each of the ten schemas of ``openai_structured.py``
  (nested objects, arrays with min/max items, enums, required and optional fields, number
  ranges, string patterns) for the model's vocabulary, fresh each time; median of 3.
- ``validity``: each schema x ``--seeds`` seeds at ``--temperature``, ``--seed-chunk`` seeds a
  batch: how many outputs parse and validate (``jsonschema``), and their finish reasons.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jsonschema

from ops.bench.common import args_record, environment, write_report
from ops.bench.openai_structured import DEFAULT_MAX_TOKENS, SCHEMAS, ask
from producer.constraints import JsonSchemaConstraint
from worker.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine.sampling_params import SamplingParams

# Never complete in --cost-tokens tokens: the mask is filled and applied at every step.
COST_SCHEMA = {
    "type": "array",
    "items": {"type": "string", "minLength": 1, "maxLength": 8},
    "minItems": 100,
}
TOPICS = ["fruits", "cities", "colors", "animals", "tools", "rivers", "planets", "names"]


def make_engine(args: argparse.Namespace) -> LLMEngine:
    blocks = args.batch * ((args.cost_tokens + 64) // 16 + 2) + 1
    scheduler: dict[str, Any] = {"max_num_seqs": max(args.batch, 64)}
    if "tpot_target_ms" in {f.name for f in dataclasses.fields(SchedulerConfig)}:
        # All jobs decode together: a TPOT target would hold prefills back on a slow machine
        # (at 400 ms a step only 7 of 64 ran at once on our loaded 2 cores).
        scheduler["tpot_target_ms"] = {}
    return LLMEngine(
        EngineConfig(
            model=args.model,
            device="cpu",
            num_threads=args.threads,
            cache=CacheConfig(block_size=16, num_blocks=max(blocks, 2048)),
            scheduler=SchedulerConfig(**scheduler),
        )
    )


def cost(engine: LLMEngine, args: argparse.Namespace) -> dict[str, Any]:
    prompts = [
        [{"role": "user", "content": f"List {TOPICS[i % len(TOPICS)]} as a JSON array."}]
        for i in range(args.batch)
    ]
    structure = JsonSchemaConstraint(schema=COST_SCHEMA)
    runs: dict[str, list[dict[str, float]]] = {"unconstrained": [], "constrained": []}
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))  # alternate who goes first
        for kind in order:
            for i, prompt in enumerate(prompts):
                params = SamplingParams(
                    temperature=0.7,
                    seed=i,
                    max_tokens=args.cost_tokens,
                    ignore_eos=True,
                    structure=structure if kind == "constrained" else None,
                )
                engine.add_prompt(f"{kind}-{r}-{i}", prompt, params)
            runs[kind].append(timed_run(engine, args.batch))
            print(f"round {r} {kind}: {runs[kind][-1]}", flush=True)
    median = {k: {m: statistics.median(x[m] for x in v) for m in v[0]} for k, v in runs.items()}
    ratio = median["constrained"]["tok_s"] / median["unconstrained"]["tok_s"]
    cpu = {k: median[k]["decode_step_cpu_ms"] for k in median}
    cpu_ratio = cpu["unconstrained"] / cpu["constrained"]
    print(f"tok/s constrained / unconstrained: {ratio:.3f}; by decode step CPU: {cpu_ratio:.3f}")
    return {"runs": runs, "median": median, "tok_s_ratio": ratio, "step_cpu_ratio": cpu_ratio}


def timed_run(engine: LLMEngine, batch: int) -> dict[str, float]:
    """Step the engine dry: output tok/s over the run (prefill included); of the steps in which
    all ``batch`` jobs decode, the median wall and CPU (process, all threads) ms, and the CPU ms
    the sampler's row processing (grammar masks; ``logits_rows``) took in them. CPU time says
    more than wall time on a machine shared with other work."""
    rows = engine.sampler.rows
    apply, spent = rows.apply, [0.0]

    def timed_apply(*a: Any) -> Any:
        start = time.process_time()
        try:
            return apply(*a)
        finally:
            spent[0] += time.process_time() - start

    rows.apply = timed_apply  # type: ignore[method-assign,assignment]
    tokens, wall_s, cpu_s, rows_s = 0, [], [], []
    start = time.perf_counter()
    while engine.has_unfinished():
        step_wall, step_cpu, spent[0] = time.perf_counter(), time.process_time(), 0.0
        outs = engine.step()
        if engine.last_num_batched_tokens == batch:
            wall_s.append(time.perf_counter() - step_wall)
            cpu_s.append(time.process_time() - step_cpu)
            rows_s.append(spent[0])
        tokens += sum(len(o.new_token_ids) for o in outs)
    wall = time.perf_counter() - start
    rows.apply = apply  # type: ignore[method-assign]

    def ms(values: list[float]) -> float:
        return round(1e3 * statistics.median(values or [float("nan")]), 2)

    return {
        "tok_s": round(tokens / wall, 2),
        "decode_step_ms": ms(wall_s),
        "decode_step_cpu_ms": ms(cpu_s),
        "row_processing_cpu_ms": ms(rows_s),
        "tokens": tokens,
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def compile_times(engine: LLMEngine) -> dict[str, float]:
    from worker.engine.grammar_xgrammar import XGrammarBackend

    eos = sorted(engine.eos_token_ids)
    backend = XGrammarBackend(engine.tokenizer, engine.model_config.vocab_size, eos)
    times = {}
    for model in SCHEMAS:
        structure = JsonSchemaConstraint(schema=model.model_json_schema())
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            backend.compile(structure)
            runs.append(time.perf_counter() - start)
        times[model.__name__] = round(1e3 * statistics.median(runs), 2)
        print(f"compile {model.__name__}: {times[model.__name__]} ms", flush=True)
    return times


def validity(engine: LLMEngine, args: argparse.Namespace) -> dict[str, Any]:
    """Each schema x seed, ``--seed-chunk`` seeds of all ten schemas per batch, printing the
    running count after each batch (a run stopped early says how far it got)."""
    per_schema: dict[str, int] = Counter()
    reasons: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    lengths: dict[str, list[int]] = {m.__name__: [] for m in SCHEMAS}
    start, end = time.perf_counter(), args.first_seed + args.seeds
    for first in range(args.first_seed, end, args.seed_chunk):
        seeds = range(first, min(first + args.seed_chunk, end))
        cases = [(model, seed) for model in SCHEMAS for seed in seeds]
        params = [
            SamplingParams(
                temperature=args.temperature,
                seed=seed,
                max_tokens=args.max_tokens,
                structure=JsonSchemaConstraint(schema=model.model_json_schema()),
            )
            for model, seed in cases
        ]
        done = engine.generate([ask(model) for model, _ in cases], params)
        for (model, seed), c in zip(cases, done, strict=True):
            reasons[str(c.finish_reason)] += 1
            lengths[model.__name__].append(len(c.token_ids))
            try:
                jsonschema.validate(json.loads(c.text), model.model_json_schema())
                per_schema[model.__name__] += 1
            except (ValueError, jsonschema.ValidationError) as exc:
                failures.append({"schema": model.__name__, "seed": seed, "tokens": len(c.token_ids),
                                 "finish": str(c.finish_reason), "text": c.text,
                                 "error": str(exc)[:200]})  # fmt: skip
        total, wall = sum(reasons.values()), time.perf_counter() - start
        valid = sum(per_schema.values())
        print(f"seeds < {seeds[-1] + 1}: valid {valid}/{total}, {dict(reasons)}, {wall:.0f} s, "
              f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    return {
        "valid": sum(per_schema.values()),
        "total": sum(reasons.values()),
        "per_schema": dict(per_schema),
        "finish_reasons": dict(reasons),
        "wall_s": round(time.perf_counter() - start, 1),
        "failures": failures,
        # Output tokens per schema, seed by seed: with a --max-tokens past the usual budget, the
        # outputs longer than it are those that budget would have cut.
        "output_tokens": lengths,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", nargs="+", default=["cost", "compile", "validity"],
                   choices=["cost", "compile", "validity"])  # fmt: skip
    p.add_argument("--model", default=None, help="default: the bundled SmolLM2-135M")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--cost-tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--first-seed", type=int, default=0, help="seeds first-seed..+seeds-1")
    p.add_argument("--seed-chunk", type=int, default=5, help="seeds per batch (x10 schemas)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    engine = make_engine(args)
    report: dict[str, Any] = {"config": args_record(args), "environment": environment(args.threads)}
    if "compile" in args.parts:
        report["compile_ms"] = compile_times(engine)
    if "cost" in args.parts:
        report["cost"] = cost(engine, args)
    if "validity" in args.parts:
        report["validity"] = validity(engine, args)
    write_report(report, args.out, default=str)


if __name__ == "__main__":
    main()
