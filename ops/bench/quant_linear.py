"""A decode step's projections from quantized weights: which kernel wins at which row count.

    python ops/bench/quant_linear.py                      # rows 1 4 8 16 32 64, 1 thread
    python ops/bench/quant_linear.py --rows 1 8 --out results/quant_linear.json

The weights are the bundled SmolLM2-135M's own 210 Q4_1 projections (30 layers x q, k, v, o,
gate, up, down), run in layer order so they stream from DRAM each round as in a step. Systems:
``fp32_onednn`` (their dequantized fp32, oneDNN-packed: today's path past 8 rows), ``fp32_skinny``
(the same through `skinny_linear`), ``q4_1`` (`gguf_linear` on the file's blocks), ``q4_1_deq``
(`gguf_dequantize` of each weight, then `F.linear`), ``q4_1_deq_onednn`` (the same, reordered
for oneDNN each call: the many-row path), ``q8_0`` and ``int8``
(the fp32 weights requantized at load, through `gguf_linear` and `int8_linear`). Time is CPU
time of the calling thread (``time.thread_time``, one torch thread), the median of ``--repeats``
rounds, so other processes on a shared machine do not enter it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.nn.functional as F

from kernels import cpu_ops
from kernels import quant_reference as qr
from ops.bench.common import write_report
from worker.models.cpu_linear import PackedLinear
from worker.models.loader import bundled_model_path

Layer = Callable[[torch.Tensor], torch.Tensor]


def cpu_seconds(layers: Sequence[tuple[int, Layer]], rows: int, repeats: int) -> float:
    inputs = {k: torch.randn(rows, k) for k in {k for k, _ in layers}}
    times = []
    for _ in range(repeats + 1):  # the first round warms up
        start = time.thread_time()
        for k, layer in layers:
            layer(inputs[k])
        times.append(time.thread_time() - start)
    return statistics.median(times[1:])


def systems(ops: Any, limit: int) -> tuple[dict[str, list[tuple[int, Layer]]], dict[str, int]]:
    """Each system's layers (in features, callable) and its weight bytes."""
    import gguf

    reader = gguf.GGUFReader(str(bundled_model_path()))
    q41 = [torch.from_numpy(t.data.copy()) for t in reader.tensors if int(t.tensor_type) == 3]
    q41 = q41[:limit]
    fp32 = [qr.dequantize(b, qr.Q4_1.type_id) for b in q41]
    q80 = [
        torch.from_numpy(gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q8_0))
        for w in fp32
    ]
    int8 = [qr.quantize_int8(w) for w in fp32]
    packed = [PackedLinear(torch.nn.Linear(w.shape[1], w.shape[0], bias=False)) for w in fp32]
    for p, w in zip(packed, fp32, strict=True):
        p.packed = torch.ops.mkldnn._reorder_linear_weight(w, None)

    def skinny_fn(w: torch.Tensor) -> Layer:
        return lambda x: ops.skinny_linear(x, w)

    def int8_fn(q: torch.Tensor, s: torch.Tensor) -> Layer:
        return lambda x: ops.int8_linear(x, q, s)

    def gguf_fn(b: torch.Tensor, t: int) -> Layer:
        return lambda x: ops.gguf_linear(x, b, t)

    def deq_fn(b: torch.Tensor, t: int) -> Layer:
        return lambda x: F.linear(x, ops.gguf_dequantize(b, t))

    def deq_onednn_fn(b: torch.Tensor, t: int) -> Layer:
        def run(x: torch.Tensor) -> torch.Tensor:
            packed = torch.ops.mkldnn._reorder_linear_weight(ops.gguf_dequantize(b, t), None)
            return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")

        return run

    def each(fn: Callable[[torch.Tensor, int], Layer], blocks: list[torch.Tensor], t: int) -> Any:
        return [(w.shape[1], fn(b, t)) for w, b in zip(fp32, blocks, strict=True)]

    found: dict[str, list[tuple[int, Layer]]] = {
        "fp32_onednn": [(w.shape[1], p) for w, p in zip(fp32, packed, strict=True)],
        "fp32_skinny": [(w.shape[1], skinny_fn(w)) for w in fp32],
        "q4_1": each(gguf_fn, q41, 3),
        "q4_1_deq": each(deq_fn, q41, 3),
        "q4_1_deq_onednn": each(deq_onednn_fn, q41, 3),
        "q8_0": each(gguf_fn, q80, 8),
        "int8": [(q.shape[1], int8_fn(q, s)) for q, s in int8],
    }
    nbytes = {
        "fp32_onednn": sum(w.numel() * 4 for w in fp32),
        "q4_1": sum(b.numel() for b in q41),
        "q8_0": sum(b.numel() for b in q80),
        "int8": sum(q.numel() + s.numel() * 4 for q, s in int8),
    }
    return found, nbytes


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--layers", type=int, default=210, help="projections of the file to run")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    ops = cpu_ops.load()
    if ops is None:
        raise SystemExit(f"C++ kernels unavailable: {cpu_ops.unavailable_reason()}")
    found, nbytes = systems(ops, args.layers)
    print("weight MB: " + ", ".join(f"{k} {v / 1e6:.1f}" for k, v in nbytes.items()))
    report: dict[str, Any] = {"threads": args.threads, "weight_bytes": nbytes, "rows": {}}
    with torch.inference_mode():
        for rows in args.rows:
            ms = {
                name: cpu_seconds(layers, rows, args.repeats) * 1e3
                for name, layers in found.items()
            }
            report["rows"][rows] = ms
            print(f"rows {rows:3d}: " + ", ".join(f"{k} {v:6.1f}" for k, v in ms.items()) + " ms")
    write_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
