"""A step's projections on CPU: torch's `F.linear`, oneDNN-packed `PackedLinear`, our C++ kernel.

    python ops/bench/cpu_linear.py                     # SmolLM2-135M's 120 layer projections
    python ops/bench/cpu_linear.py --rows 1 8 32 --threads 1 --out results/cpu_linear.json

The shapes are one decode step of SmolLM2-135M without its LM head: 30 layers x (qkv 576->960,
o 576->576, gate_up 576->3072, down 1536->576), random fp32 weights, about 425 MB. Each system
runs all of them in layer order, as a step does, so the weights stream from DRAM each round; the
time is the median of ``--repeats`` rounds. The result is printed per row count with the weight
bytes read per second and the FLOP/s achieved: small row counts are bound by the first, large
ones by the second. ``skinny`` is our `skinny_linear` (kernels/cpu_linear.cpp) on the plain
weights, checked against `F.linear` before it is timed; it is left out where the C++ kernels do
not build.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
from torch import nn

from kernels import cpu_ops
from ops.bench.common import median_seconds, write_report
from worker.models.cpu_linear import PackedLinear, onednn_supports

LAYER_SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)]  # (in, out) per layer


class Skinny(nn.Module):
    """`nn.Linear`'s plain weight through our C++ few-row kernel."""

    def __init__(self, linear: nn.Linear, ops: Any) -> None:
        super().__init__()
        self.in_features, self.weight, self.ops = linear.in_features, linear.weight.detach(), ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.skinny_linear(x, self.weight)


def step_seconds(layers: Sequence[Any], inputs: dict[int, torch.Tensor], repeats: int) -> float:
    def one_round() -> None:
        for layer in layers:
            layer(inputs[layer.in_features])

    return median_seconds(one_round, repeats)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64, 256, 512])
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--out", type=Path)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if not onednn_supports(torch.float32):
        raise SystemExit("this torch build has no oneDNN")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shapes = LAYER_SHAPES * args.layers
    plain = [nn.Linear(i, o, bias=False) for i, o in shapes]
    packed = [PackedLinear(linear) for linear in plain]
    ops = cpu_ops.load()
    skinny = [Skinny(linear, ops) for linear in plain] if ops is not None else []
    weight_bytes = sum(i * o * 4 for i, o in shapes)
    report: dict[str, Any] = {"threads": args.threads, "weight_bytes": weight_bytes, "rows": {}}
    with torch.inference_mode():
        for rows in args.rows:
            inputs = {i: torch.randn(rows, i) for i in {i for i, _ in shapes}}
            torch_s = step_seconds(plain, inputs, args.repeats)
            onednn_s = step_seconds(packed, inputs, args.repeats)
            flop = 2 * rows * weight_bytes / 4
            report["rows"][rows] = result = {
                "torch_ms": torch_s * 1e3,
                "onednn_ms": onednn_s * 1e3,
                "onednn_weight_gb_s": weight_bytes / onednn_s / 1e9,
                "onednn_gflop_s": flop / onednn_s / 1e9,
                "torch_over_onednn": torch_s / onednn_s,
            }
            line = (
                f"rows {rows:4d}: torch {result['torch_ms']:7.1f} ms, oneDNN"
                f" {result['onednn_ms']:7.1f} ms ({result['onednn_weight_gb_s']:5.1f} GB/s of"
                f" weights, {result['onednn_gflop_s']:6.1f} GFLOP/s), torch / oneDNN"
                f" {result['torch_over_onednn']:.2f}"
            )
            if skinny:
                for ours, ref in ((skinny[k], plain[k]) for k in range(4)):
                    x = inputs[ref.in_features]
                    torch.testing.assert_close(ours(x), ref(x), rtol=1e-4, atol=1e-4)
                skinny_s = step_seconds(skinny, inputs, args.repeats)
                result["skinny_ms"] = skinny_s * 1e3
                result["skinny_weight_gb_s"] = weight_bytes / skinny_s / 1e9
                result["onednn_over_skinny"] = onednn_s / skinny_s
                line += (
                    f"; skinny {skinny_s * 1e3:7.1f} ms ({result['skinny_weight_gb_s']:5.1f}"
                    f" GB/s), oneDNN / skinny {onednn_s / skinny_s:.2f}"
                )
            print(line)
    write_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
