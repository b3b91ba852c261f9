"""What one engine step costs by what it carries: decode steps of N rows, a prompt of P tokens
alone, and a decode step with one short prompt beside it (wall ms, medians).

    python ops/bench/step_rows.py --threads 1 --rows 1 8 64 --prompt-tokens 1 8 64

This is why a chat waits for the batch step in progress on the CPU (a step costs what its rows
cost) and not much on a GPU (``worker/engine/batch_cap.py``): compare the N-row decode steps
with the one-row one. Requests are greedy with random prompt ids and ``ignore_eos``; the TPOT
targets and the first-token lane are off, so each step carries exactly what is asked.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ops.bench.common import environment, write_report
from ops.bench.our_engine import add_engine_arguments, engine_config, greedy
from worker.engine.llm_engine import LLMEngine


class Stepper:
    """An engine and fresh requests of distinct random prompts."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.count = 0

    def add(self, prompt_tokens: int, max_tokens: int) -> None:
        self.count += 1
        ids = [(1000 + 7919 * self.count + j) % 40000 for j in range(prompt_tokens)]
        self.engine.add_prompt(f"r{self.count}", params=greedy(max_tokens), prompt_token_ids=ids)

    def timed_ms(self, steps: int = 1) -> float:
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            self.engine.step()
            times.append(1000 * (time.perf_counter() - start))
        return statistics.median(times)

    def drain(self) -> None:
        while self.engine.has_unfinished():
            self.engine.step()


def measure(
    s: Stepper, rows: Sequence[int], prompts: Sequence[int], repeats: int
) -> dict[str, Any]:
    s.add(8, 4)  # warm-up
    s.drain()
    prompt_ms = {}
    for p in prompts:
        runs = []
        for _ in range(repeats):
            s.add(p, 1)
            runs.append(s.timed_ms())
            s.drain()
        prompt_ms[p] = statistics.median(runs)
    decode_ms, with_prompt_ms = {}, {}
    for n in rows:
        for _ in range(n):
            s.add(7, 4 * repeats + 8)
        s.engine.step()  # their prompts
        decode_ms[n] = s.timed_ms(2 * repeats)
        s.add(7, 2)
        with_prompt_ms[n] = s.timed_ms()
        s.drain()
    return {"prompt_alone_ms": prompt_ms, "decode_ms": decode_ms,
            "decode_and_7_token_prompt_ms": with_prompt_ms}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_arguments(ap)
    ap.add_argument("--quantization", default="auto", help="as the worker's flag")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    ap.add_argument("--prompt-tokens", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    config = engine_config(args, args.model)
    scheduler = replace(config.scheduler, tpot_target_ms={}, first_token_lane_steps=0)
    config = replace(config, scheduler=scheduler, quantization=args.quantization)
    measured = measure(Stepper(LLMEngine(config)), args.rows, args.prompt_tokens, args.repeats)
    report = {"environment": environment(args.threads), "quantization": args.quantization}
    report.update(measured)
    print(report)
    write_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
