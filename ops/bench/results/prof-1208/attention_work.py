"""The attention work of engine.py's seeded mix: decode context tokens and their float32 K/V
bytes, and causal prefill attention FLOPs (SmolLM2-135M: 30 layers, 9 query / 3 KV heads of 64).

    .venv/bin/python ops/bench/results/prof-1208/attention_work.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from ops.bench.engine_workload import make_workload  # noqa: E402

LAYERS, Q_HEADS, KV_HEADS, HEAD = 30, 9, 3, 64
KV_BYTES = LAYERS * KV_HEADS * HEAD * 4 * 2  # a context token's K and V in float32, all layers
for n, scale in ((64, 1.0), (32, 0.5)):
    # Token ids do not change lengths; any ids will do.
    work = make_workload(n, 0, scale, list(range(1000, 40000)))
    # Each decode after the first token attends over the prompt and the tokens made so far.
    ctx = sum(sum(range(len(r.prompt_ids) + 1, len(r.prompt_ids) + r.output_len)) for r in work)
    prefill = sum(len(r.prompt_ids) ** 2 / 2 for r in work) * 4 * Q_HEADS * HEAD * LAYERS
    print(
        f"{n} requests, scale {scale}: decode context tokens {ctx:,}, K/V read "
        f"{ctx * KV_BYTES / 1e9:.1f} GB; prefill attention {prefill / 1e9:.0f} GFLOP"
    )
