"""Decode attention over a KV pool on 4 KB pages against the same pool on huge pages.

    python ops/bench/kv_pages.py --threads 2 --shapes 14x400 8x1000 40x300 \
        --out ops/bench/results/kv_pages.json

Our C++ `paged_decode_attention` (the CPU engine's) over 30 layers' caches in SmolLM2-135M's
shape (3 KV heads, 9 query heads, head size 64, 16-token blocks), each sequence's blocks
scattered over the pool as a busy pool's are. One pool comes from ``torch.zeros`` (4 KB pages:
torch's allocator does not ask for more), the other from `worker.engine.huge_pages.zeros`
(advised ``MADV_HUGEPAGE``), both holding the same values; the two are timed in turn in one
process, ``--rounds`` times, and their outputs checked equal. Reports ms per step (all layers,
median) and GB/s of K/V read. ``BxC``: B sequences of C tokens each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

# Run as a script, this folder is sys.path[0] and its kernels.py would shadow the kernels package.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernels import cpu_ops
from ops.bench.common import environment, write_report
from worker.engine import huge_pages

LAYERS, KV_HEADS, Q_HEADS, HEAD_SIZE, BLOCK = 30, 3, 9, 64, 16


def measure(ops: Any, batch: int, ctx: int, rounds: int) -> dict[str, float]:
    per_seq = -(-ctx // BLOCK)
    shape = (batch * per_seq * LAYERS, KV_HEADS, BLOCK, HEAD_SIZE)
    plain = [torch.zeros(shape), torch.zeros(shape)]
    for t in plain:
        t.normal_()
    huge = [huge_pages.zeros(shape, torch.float32) for _ in plain]
    for dst, src in zip(huge, plain, strict=True):
        dst.copy_(src)
    order = torch.randperm(shape[0], dtype=torch.int32)
    tables = order.view(LAYERS, batch, per_seq)  # each layer's sequences on blocks of their own
    lens = torch.full((batch,), ctx, dtype=torch.int32)
    q = torch.randn(batch, Q_HEADS, HEAD_SIZE)
    outs = {"4k": torch.empty_like(q), "huge": torch.empty_like(q)}
    pools = {"4k": plain, "huge": huge}
    times: dict[str, list[float]] = {name: [] for name in pools}
    for _ in range(rounds + 1):  # the first round warms both up and is dropped
        for name, (k, v) in pools.items():
            start = time.perf_counter()
            for layer in range(LAYERS):
                ops.paged_decode_attention(outs[name], q, k, v, tables[layer], lens, 0.125)
            times[name].append(time.perf_counter() - start)
    if not torch.equal(outs["4k"], outs["huge"]):
        raise AssertionError("the two pools gave different outputs")
    kv_bytes = 2 * LAYERS * batch * ctx * KV_HEADS * HEAD_SIZE * 4
    result = {}
    for name, runs in times.items():
        median = statistics.median(runs[1:])
        result[f"{name}_ms"] = round(1000 * median, 2)
        result[f"{name}_gb_s"] = round(kv_bytes / median / 1e9, 1)
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", nargs="+", default=["14x400", "8x1000", "40x300"])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    ops = cpu_ops.load()
    if ops is None:
        raise SystemExit(f"no C++ kernels: {cpu_ops.unavailable_reason()}")
    results = {}
    for shape in args.shapes:
        batch, ctx = (int(x) for x in shape.split("x"))
        results[shape] = measure(ops, batch, ctx, args.rounds)
        print(shape, results[shape], flush=True)
    report = {"environment": environment(args.threads), "rounds": args.rounds, "shapes": results}
    write_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
