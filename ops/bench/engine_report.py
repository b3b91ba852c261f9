"""engine.py's report: each system's rates against the matmul ceiling in its dtype, greedy
parity of every peer with ours, and the table printed at the end.

Rates count useful tokens only (the workload's prompt and forced output tokens) and the
workload's own FLOPs (`engine_workload.useful_flops`), so every system is measured on the same
work whatever it recomputes or pads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ops.bench.common import MATMUL_N, matmul_gflops
from ops.bench.engine_workload import BenchRequest, SystemResult

GPU_MATMUL_N = 8192  # fills an H200; MATMUL_N (2048) fills a CPU


@dataclass(frozen=True)
class Ceilings:
    """Matmul GFLOP/s in the run's dtype and, when ``ours-bf16`` runs, in bf16 (else 0)."""

    dtype: float
    bf16: float

    @classmethod
    def measure(cls, device: str, dtype: str, systems: Sequence[str]) -> Ceilings:
        n = GPU_MATMUL_N if device == "cuda" else MATMUL_N
        bf16 = "ours-bf16" in systems
        return cls(
            matmul_gflops(n, dtype=getattr(torch, dtype), device=device),
            matmul_gflops(n, dtype=torch.bfloat16, device=device) if bf16 else 0.0,
        )

    def of(self, system: str) -> float:
        """Each system is held against a matmul in its own dtype."""
        return self.bf16 if system == "ours-bf16" else self.dtype


def parity(
    a: SystemResult, b: SystemResult, workload: Sequence[BenchRequest], n: int
) -> dict[str, Any]:
    """Exact greedy matches over the first ``n`` requests, and where each mismatch starts."""
    first_diff: dict[str, int] = {}
    for r in workload[:n]:
        x, y = a.outputs[r.request_id], b.outputs[r.request_id]
        if x != y:
            first_diff[r.request_id] = next(
                i for i, (p, q) in enumerate(zip(x, y, strict=True)) if p != q
            )
    checked = min(n, len(workload))
    return {"checked": checked, "equal": checked - len(first_diff), "first_diff_at": first_diff}


def summarize(
    result: SystemResult, totals: dict[str, Any], flops: dict[str, float], ceiling: float
) -> dict[str, Any]:
    gflops = flops["total"] / result.wall_s / 1e9
    return {
        "wall_s": result.wall_s,
        "output_tokens": totals["output_tokens"],
        "output_tok_s": totals["output_tokens"] / result.wall_s,
        "total_tok_s": totals["total_tokens"] / result.wall_s,
        "model_gflop_s": gflops,
        "pct_of_matmul": 100 * gflops / ceiling,
        **result.extra,
    }


def summarize_all(
    results: Mapping[str, SystemResult],
    totals: dict[str, Any],
    flops: dict[str, float],
    ceilings: Ceilings,
) -> dict[str, dict[str, Any]]:
    """Every system's summary, with ``ours_speedup`` (ours' output tok/s over its) when ours ran."""
    systems = {name: summarize(r, totals, flops, ceilings.of(name)) for name, r in results.items()}
    if "ours" in systems:
        for s in systems.values():
            s["ours_speedup"] = systems["ours"]["output_tok_s"] / s["output_tok_s"]
    return systems


def parity_vs_ours(
    results: Mapping[str, SystemResult], workload: Sequence[BenchRequest], n: int
) -> dict[str, dict[str, Any]]:
    if "ours" not in results:
        return {}
    ours = results["ours"]
    return {name: parity(ours, r, workload, n) for name, r in results.items() if name != "ours"}


def print_table(report: dict[str, Any]) -> None:
    t, env = report["workload"], report["environment"]
    print(
        f"\n{env['cpu_model']}  {env.get('device', 'cpu')}  torch {env['torch']}  "
        f"{env['threads']} threads  "
        f"{report['config']['dtype']} matmul {report['matmul_gflop_s']:.1f} GFLOP/s  "
        f"bf16 matmul {report.get('matmul_bf16_gflop_s', 0.0):.1f} GFLOP/s  "
        f"load avg {env['loadavg_start']}"
    )
    print(
        f"{t['num_requests']} requests {t['requests_per_class']}: {t['prompt_tokens']} prompt + "
        f"{t['output_tokens']} output tokens, {report['useful_gflop']:.1f} GFLOP of model work"
    )
    head = f"{'system':<10} {'wall s':>8} {'out tok/s':>10} {'tot tok/s':>10} {'GFLOP/s':>8}"
    print(head + f" {'%matmul':>8} {'ours x':>7}")
    for name, s in report["systems"].items():
        ratio = s.get("ours_speedup")
        print(
            f"{name:<10} {s['wall_s']:>8.2f} {s['output_tok_s']:>10.1f} {s['total_tok_s']:>10.1f} "
            f"{s['model_gflop_s']:>8.2f} {s['pct_of_matmul']:>8.1f} "
            f"{'' if ratio is None else f'{ratio:.2f}':>7}"
        )
    ours = report["systems"].get("ours")
    if ours:
        print(
            f"ours: {ours['steps']} steps, {ours['preemptions']} preemptions, "
            f"{ours['computed_tokens']} tokens computed, KV {ours['kv_cache_tokens']} tokens"
        )
    for peer, p in report["parity_vs_ours"].items():
        diffs = p["first_diff_at"] or "none"
        print(
            f"greedy parity ours vs {peer}: {p['equal']}/{p['checked']} equal; diverge at {diffs}"
        )
