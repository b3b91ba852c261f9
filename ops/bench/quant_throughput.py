"""Batched throughput of ``--quantization`` choices on engine.py's offline mix, in one process.

    python ops/bench/quant_throughput.py 32 0.5 gguf none     # requests, --scale, formats

Each format's engine (the bundled SmolLM2-135M, 1 thread) runs the same seeded requests after a
warm-up; output tokens per second of process CPU time (other processes on a shared machine do
not enter it) and of wall time are printed beside the load average.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from ops.bench.engine_workload import make_workload, normal_token_ids, warmup_prompt
from ops.bench.our_engine import step_all, warm_up
from worker.engine.config import EngineConfig
from worker.engine.llm_engine import LLMEngine
from worker.models.loader import bundled_model_path


def run(n: int, scale: float, quantization: Any) -> str:  # one of EngineConfig.quantization's
    config = EngineConfig(
        model=str(bundled_model_path()), device="cpu", num_threads=1, quantization=quantization
    )
    engine = LLMEngine(config)
    ids = normal_token_ids(engine.tokenizer, engine.model_config.vocab_size)
    workload = make_workload(n, 0, scale, ids)
    warm_up(engine, warmup_prompt(ids))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    outputs = step_all(engine, workload)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    tokens = sum(len(v) for v in outputs.values())
    return (
        f"{quantization}: {tokens} output tokens, {tokens / cpu:.1f} tok/s CPU, "
        f"{tokens / wall:.1f} tok/s wall, load {os.getloadavg()[0]:.1f}"
    )


def main() -> None:
    n, scale, *formats = sys.argv[1:]
    torch.set_num_threads(1)
    for quantization in formats:
        print(run(int(n), float(scale), quantization), flush=True)


if __name__ == "__main__":
    main()
