"""8-bit weights on the GPU, one projection at a time: kernels/triton_quant.py's `w8_linear` at
each candidate tile shape against bf16's cuBLAS GEMM and FP8's ``_scaled_mm``, at decode rows.

    python ops/bench/quant_gpu.py --out quant_gpu.json          # CUDA: ~1 minute
    python ops/bench/quant_gpu.py --smoke                       # CPU, interpreter: plumbing only

Shapes: Llama-3.2-1B's four projections (fused q/k/v, o, fused gate/up, down). A weight that
stays in the 50 MB L2 between calls would time far faster than a decode step sees it (each
layer's weights are evicted by the other 15's), so every timed call reads the next of enough
copies of the weight to pass 256 MB. Each figure: 20 calls captured in one CUDA graph, the
median of 5 replays, per call. ``GB/s`` counts the weight's bytes only (the rows of x are
small). ``default`` is `tiles_for(rows)`, what the engine launches.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
if not torch.cuda.is_available():  # the smoke run: Triton kernels under the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels import quant_reference as qr
from kernels import triton_quant as tq

# (name, N, K) of Llama-3.2-1B: hidden 2048, 32 q and 8 KV heads of 64, MLP 8192.
SHAPES = (("qkv", 3072, 2048), ("o", 2048, 2048), ("gate_up", 16384, 2048), ("down", 2048, 8192))
SMOKE_SHAPES = (("tiny", 40, 96),)
ROWS = (1, 8, 16, 32, 64, 128, 256, 512)
# Candidates beside TILES' own: narrower and wider along N, shorter and longer K steps, more
# warps and stages for the larger row counts.
CANDIDATES = (
    tq.Tiles(16, 16, 512),
    tq.Tiles(16, 16, 256, num_stages=4),
    tq.Tiles(16, 32, 256),
    tq.Tiles(16, 32, 512),
    tq.Tiles(16, 64, 64),
    tq.Tiles(16, 64, 128),
    tq.Tiles(16, 16, 1024, num_stages=2),
    tq.Tiles(32, 32, 256),
    tq.Tiles(32, 64, 128),
    tq.Tiles(64, 64, 128),
    tq.Tiles(64, 128, 64),
    tq.Tiles(64, 128, 128, num_warps=8),
    tq.Tiles(128, 128, 64, num_warps=8),
)
L2_PASS_BYTES = 256 << 20
CALLS, REPLAYS = 20, 5


def per_call_us(calls: list[Callable[[], Any]], device: str) -> float:
    """Median µs a call: ``calls`` (one per weight copy, cycled) captured 20 at a time."""
    seq = [calls[i % len(calls)] for i in range(CALLS)]
    for c in seq:  # compile, pick cuBLAS algorithms: outside the graph
        c()
    if device != "cuda":
        start = time.perf_counter()
        for c in seq:
            c()
        return 1e6 * (time.perf_counter() - start) / CALLS
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in seq:
            c()
    times = []
    for _ in range(REPLAYS + 1):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(1e3 * begin.elapsed_time(end) / CALLS)
    return statistics.median(times[1:])


def run_shape(
    name: str, n: int, k: int, rows: Sequence[int], device: str, tiles: Sequence[tq.Tiles]
) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=gen) / k**0.5
    q8, s8 = (t.to(device) for t in qr.quantize_int8(w))
    f8, sf = (t.to(device) for t in tq.quantize_fp8(w))
    copies = max(1, min(64, -(-L2_PASS_BYTES // (n * k))))
    ints = [(q8.clone(), s8) for _ in range(copies)]
    fp8s = [(f8.clone(), sf) for _ in range(copies)]
    bf16 = [w.to(device, torch.bfloat16) for _ in range(max(1, copies // 2))]
    results = []
    for m in rows:
        x = torch.randn(m, k, generator=gen).to(device, torch.bfloat16)
        row: dict[str, Any] = {"shape": name, "n": n, "k": k, "rows": m}
        row["bf16_us"] = per_call_us(
            [partial(torch.nn.functional.linear, x, b) for b in bf16], device
        )
        if tq.fp8_supported(x.device) and device == "cuda":
            row["scaled_mm_us"] = per_call_us([partial(tq.fp8_linear, x, *c) for c in fp8s], device)
        default = tq.tiles_for(m)
        row["default"] = tile_name(default)
        row["int8_us"] = {
            tile_name(t): per_call_us([partial(tq.w8_linear, x, *c, tiles=t) for c in ints], device)
            for t in dict.fromkeys((default, *tiles))
        }
        row["e4m3_default_us"] = per_call_us([partial(tq.w8_linear, x, *c) for c in fp8s], device)
        best = min(row["int8_us"], key=row["int8_us"].get)
        row["best"], row["best_us"] = best, row["int8_us"][best]
        row["int8_default_gbps"] = n * k / row["int8_us"][row["default"]] / 1e3
        row["bf16_gbps"] = 2 * n * k / row["bf16_us"] / 1e3
        print(line(row), flush=True)
        results.append(row)
    return results


def tile_name(t: tq.Tiles) -> str:
    return f"{t.block_m}x{t.block_n}x{t.block_k}/w{t.num_warps}s{t.num_stages}"


def line(r: dict[str, Any]) -> str:
    mm = f"{r['scaled_mm_us']:8.1f}" if "scaled_mm_us" in r else "       -"
    return (
        f"{r['shape']:>8} {r['rows']:>4} | bf16 {r['bf16_us']:8.1f} us {r['bf16_gbps']:6.0f} GB/s"
        f" | scaled_mm {mm} | int8 default {r['int8_us'][r['default']]:8.1f} us "
        f"{r['int8_default_gbps']:6.0f} GB/s ({r['default']}) | best {r['best_us']:8.1f} "
        f"({r['best']}) | e4m3 default {r['e4m3_default_us']:8.1f}"
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes, 2 tiles (CPU)")
    p.add_argument("--rows", default=",".join(map(str, ROWS)))
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    tiles = CANDIDATES[:2] if args.smoke else CANDIDATES
    rows = [int(r) for r in args.rows.split(",")]
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "results": [],
    }
    for name, n, k in shapes:
        report["results"] += run_shape(name, n, k, rows, device, tiles)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
