"""A decode step's projections from quantized weights: which kernel wins at which row count.

    python ops/bench/quant_linear.py                      # rows 1 4 8 16 32 64, 1 thread
    python ops/bench/quant_linear.py --rows 1 8 --out results/quant_linear.json

The weights are the bundled SmolLM2-135M's own 210 Q4_1 projections (30 layers x q, k, v, o,
gate, up, down), run in layer order so they stream from DRAM each round as in a step. Systems:
``fp32_onednn`` (their dequantized fp32, oneDNN-packed: today's path past 8 rows), ``fp32_skinny``
(the same through `skinny_linear`), ``q4_1`` (`gguf_linear` on the file's blocks), ``q4_1_deq``
(`gguf_dequantize` of each weight, then `dense_linear`: the engine's many-row path),
``q4_1_deq_onednn`` (the same, reordered for oneDNN each call: that path until 2026-12-05,
slower on every machine since), ``q8_0`` and ``int8``
(the fp32 weights requantized at load, through `gguf_linear` and `int8_linear`), ``q4_1_a8`` and
``q8_0_a8`` (`gguf_linear_q8`: x rounded to 8 bits, integer dot products, on the file's
layout), ``q4_1_a8p`` and ``q8_0_a8p`` (the same on the blocks stored as panels of the
build's `q8_panel_rows`), ``q4_0`` (the fp32 weights requantized to Q4_0 blocks,
`gguf_linear`), ``q4_1_kmajor``, ``q8_0_kmajor`` and ``q4_0_kmajor`` (`gguf_linear_kmajor` on
the blocks stored k-major, where the build has it), ``q4_1@MODE`` (the engine's
`QuantWeight.linear` under each ``--quant-activations`` mode; under ``int8`` the blocks are
stored as panels, under ``float32`` k-major where the build reads them, `gguf_linear_kmajor`);
with ``--avx2`` also each quantized system again as ``*_avx2``, the same kernels built with
``-march=haswell`` (their AVX2 paths, `cpu_ops.load("haswell")`) on this machine. Time is CPU
time of the calling thread (``time.thread_time``, one torch thread), the median of ``--repeats``
rounds, so other processes on a shared machine do not enter it. With ``--threads`` above 1 it
is wall time (``--clock``): the calling thread's CPU time then counts only its own share of
the work. ``--systems`` runs only those named.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from kernels import cpu_ops
from kernels import quant_reference as qr
from ops.bench.common import CLOCKS, median_seconds, write_report
from worker.models.cpu_linear import PackedLinear
from worker.models.loader import bundled_model_path
from worker.models.quant import ACTIVATIONS, QuantWeight
from worker.models.quant_paths import dense_linear

Layer = Callable[[torch.Tensor], torch.Tensor]


def round_seconds(
    layers: Sequence[tuple[int, Layer]],
    rows: int,
    repeats: int,
    clock: Callable[[], float] = time.thread_time,
) -> float:
    """Median time by ``clock`` of a round of ``layers`` on ``rows`` rows, after one warm-up."""
    inputs = {k: torch.randn(rows, k) for k in {k for k, _ in layers}}

    def one_round() -> None:
        for k, layer in layers:
            layer(inputs[k])

    return median_seconds(one_round, repeats, clock=clock)


class Weights(NamedTuple):
    """The file's Q4_1 projections and what each system makes of them."""

    q41: list[torch.Tensor]  # the file's blocks
    fp32: list[torch.Tensor]  # their dequantized values
    q80: list[torch.Tensor]  # fp32 requantized to Q8_0 blocks
    q40: list[torch.Tensor]  # and to Q4_0 blocks
    int8: list[tuple[torch.Tensor, torch.Tensor]]  # fp32 as per-channel int8 (codes, scale)


def file_weights(limit: int) -> Weights:
    import gguf

    reader = gguf.GGUFReader(str(bundled_model_path()))
    q41 = [torch.from_numpy(t.data.copy()) for t in reader.tensors if int(t.tensor_type) == 3]
    fp32 = [qr.dequantize(b, qr.Q4_1.type_id) for b in q41[:limit]]
    q80 = [
        torch.from_numpy(gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q8_0))
        for w in fp32
    ]
    q40 = [
        torch.from_numpy(gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q4_0))
        for w in fp32
    ]
    return Weights(q41[:limit], fp32, q80, q40, [qr.quantize_int8(w) for w in fp32])


def quantized_systems(module: Any, w: Weights, suffix: str = "") -> dict[str, list[Any]]:
    """``module``'s `gguf_linear` on the Q4_1 and Q8_0 blocks and its `int8_linear`."""

    def gguf_fn(b: torch.Tensor, t: int) -> Layer:
        return lambda x: module.gguf_linear(x, b, t)

    def q8_fn(b: torch.Tensor, t: int) -> Layer:
        return lambda x: module.gguf_linear_q8(x, b, t)

    def panel_fn(b: torch.Tensor, t: int) -> Layer:
        panels = qr.pack_panels(b, t, module.q8_panel_rows())
        return lambda x: module.gguf_linear_q8(x, panels, t, None, True)

    def int8_fn(q: torch.Tensor, s: torch.Tensor) -> Layer:
        return lambda x: module.int8_linear(x, q, s)

    def kmajor_fn(b: torch.Tensor, t: int) -> Layer:
        packed = qr.pack_kmajor(b, t)
        return lambda x: module.gguf_linear_kmajor(x, packed, t)

    formats = {"q4_1": (3, w.q41), "q8_0": (8, w.q80), "q4_0": (2, w.q40)}
    kmajor = {  # the exact kernel on the blocks stored k-major, where the build has it
        f"{name}_kmajor{suffix}": [
            (f.shape[1], kmajor_fn(b, t)) for f, b in zip(w.fp32, blocks, strict=True)
        ]
        for name, (t, blocks) in formats.items()
        if module.gguf_kmajor_supported(t)
    }
    return {
        **kmajor,
        "q4_0" + suffix: [(f.shape[1], gguf_fn(b, 2)) for f, b in zip(w.fp32, w.q40, strict=True)],
        "q4_1" + suffix: [(f.shape[1], gguf_fn(b, 3)) for f, b in zip(w.fp32, w.q41, strict=True)],
        "q4_1_a8" + suffix: [(f.shape[1], q8_fn(b, 3)) for f, b in zip(w.fp32, w.q41, strict=True)],
        "q8_0" + suffix: [(f.shape[1], gguf_fn(b, 8)) for f, b in zip(w.fp32, w.q80, strict=True)],
        "q8_0_a8" + suffix: [(f.shape[1], q8_fn(b, 8)) for f, b in zip(w.fp32, w.q80, strict=True)],
        "q4_1_a8p" + suffix: [
            (f.shape[1], panel_fn(b, 3)) for f, b in zip(w.fp32, w.q41, strict=True)
        ],
        "q8_0_a8p" + suffix: [
            (f.shape[1], panel_fn(b, 8)) for f, b in zip(w.fp32, w.q80, strict=True)
        ],
        "int8" + suffix: [(q.shape[1], int8_fn(q, s)) for q, s in w.int8],
    }


def engine_paths(ops: Any, w: Weights) -> dict[str, list[tuple[int, Layer]]]:
    """``q4_1@<mode>``: the engine's own dispatch (`QuantWeight.linear`) on the Q4_1 blocks under
    each ``--quant-activations`` mode, whichever kernel or GEMM it picks at a step's rows."""
    found = {}
    for mode in ACTIVATIONS:
        weights = [QuantWeight(b, 3) for b in w.q41]
        for q in weights:
            q.attach(ops, mode)
        found[f"q4_1@{mode}"] = [(q.in_features, partial(q.linear, bias=None)) for q in weights]
    return found


def systems(
    ops: Any, limit: int, avx2: Any = None
) -> tuple[dict[str, list[tuple[int, Layer]]], dict[str, int]]:
    """Each system's layers (in features, callable) and its weight bytes; ``avx2``: the
    haswell build, whose quantized kernels join as ``*_avx2``."""
    w = file_weights(limit)
    packed = [PackedLinear(torch.nn.Linear(f.shape[1], f.shape[0], bias=False)) for f in w.fp32]
    for p, f in zip(packed, w.fp32, strict=True):
        p.packed = torch.ops.mkldnn._reorder_linear_weight(f, None)

    def skinny_fn(f: torch.Tensor) -> Layer:
        return lambda x: ops.skinny_linear(x, f)

    def deq_fn(b: torch.Tensor) -> Layer:
        return lambda x: dense_linear(x, ops.gguf_dequantize(b, 3), None)

    def deq_onednn_fn(b: torch.Tensor) -> Layer:
        def run(x: torch.Tensor) -> torch.Tensor:
            packed = torch.ops.mkldnn._reorder_linear_weight(ops.gguf_dequantize(b, 3), None)
            return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")

        return run

    ks = [f.shape[1] for f in w.fp32]
    found: dict[str, list[tuple[int, Layer]]] = {
        "fp32_onednn": list(zip(ks, packed, strict=True)),
        "fp32_skinny": [(k, skinny_fn(f)) for k, f in zip(ks, w.fp32, strict=True)],
        "q4_1_deq": [(k, deq_fn(b)) for k, b in zip(ks, w.q41, strict=True)],
        "q4_1_deq_onednn": [(k, deq_onednn_fn(b)) for k, b in zip(ks, w.q41, strict=True)],
        **quantized_systems(ops, w),
        **engine_paths(ops, w),
        **(quantized_systems(avx2, w, "_avx2") if avx2 is not None else {}),
    }
    nbytes = {
        "fp32_onednn": sum(f.numel() * 4 for f in w.fp32),
        "q4_1": sum(b.numel() for b in w.q41),
        "q8_0": sum(b.numel() for b in w.q80),
        "int8": sum(q.numel() + s.numel() * 4 for q, s in w.int8),
    }
    return found, nbytes


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--layers", type=int, default=210, help="projections of the file to run")
    p.add_argument("--avx2", action="store_true", help="also the -march=haswell build's kernels")
    p.add_argument("--systems", nargs="+", help="only these systems (default: all)")
    p.add_argument(
        "--clock",
        choices=CLOCKS,
        help="thread: the calling thread's CPU time (other processes stay out of it); wall: "
        "elapsed time, which counts every thread's share. Default: thread at 1 --threads, else "
        "wall",
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    args.clock = args.clock or ("thread" if args.threads == 1 else "wall")
    torch.set_num_threads(args.threads)
    ops = cpu_ops.load()
    avx2 = cpu_ops.load("haswell") if args.avx2 else None
    if ops is None or (args.avx2 and avx2 is None):
        reason = cpu_ops.unavailable_reason() or cpu_ops.unavailable_reason("haswell")
        raise SystemExit(f"C++ kernels unavailable: {reason}")
    found, nbytes = systems(ops, args.layers, avx2)
    if args.systems:
        unknown = set(args.systems) - set(found)
        if unknown:
            p.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(found)}")
        found = {name: found[name] for name in args.systems}
    print("weight MB: " + ", ".join(f"{k} {v / 1e6:.1f}" for k, v in nbytes.items()))
    report: dict[str, Any] = {
        "threads": args.threads,
        "clock": args.clock,
        "weight_bytes": nbytes,
        "rows": {},
    }
    clock = CLOCKS[args.clock]
    with torch.inference_mode():
        for rows in args.rows:
            ms = {
                name: round_seconds(layers, rows, args.repeats, clock) * 1e3
                for name, layers in found.items()
            }
            report["rows"][rows] = ms
            print(f"rows {rows:3d}: " + ", ".join(f"{k} {v:6.1f}" for k, v in ms.items()) + " ms")
    write_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
