"""The figures of a `gpu_check.sh` run in a few lines, from the JSON reports it left in $OUT.

    python ops/bench/gpu_summary.py ops/bench/results/gpu

The device tool returns only the last 12,000 characters of a run's output, so the script ends
with this digest: output tok/s of every engine run, and each decode step against its byte floor.
Reports it does not know (or that a killed part never wrote) are named and skipped.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def engine_lines(name: str, report: dict[str, Any]) -> list[str]:
    """``ops/bench/engine.py``: the workload, then output tok/s of each system."""
    w = report["workload"]
    kinds = ",".join(c["name"] for c in report.get("classes", []))
    lines = [
        f"{name}: {w['num_requests']} requests ({kinds}), {w['prompt_tokens']} prompt + "
        f"{w['output_tokens']} output tokens"
    ]
    for system, s in report["systems"].items():
        steps = f", {s['steps']} steps, {s['preemptions']} preemptions" if "steps" in s else ""
        lines.append(
            f"  {system:<9} {s['output_tok_s']:>9.1f} out tok/s  {s['wall_s']:>7.2f} s{steps}"
        )
    for system, error in report.get("failed", {}).items():
        lines.append(f"  {system:<9} FAILED: {error[:160]}")
    for peer, p in report.get("parity_vs_ours", {}).items():
        lines.append(f"  greedy parity vs {peer}: {p['equal']}/{p['checked']}")
    return lines


def steps_lines(name: str, report: dict[str, Any]) -> list[str]:
    """``ops/bench/gpu_steps.py``: ms per decode step, its floor, and the idle share."""
    m = report["model"]
    lines = [
        f"{name}: {m['model_type']} {m['layers']} layers, weights "
        f"{report['weight_bytes'] / 1e9:.2f} GB, copy {report['copy_gbps']:.0f} GB/s, "
        f"graphs {len(report.get('graph_sizes', []))} sizes, eager {report['enforce_eager']}, "
        f"FP8 projections {report.get('fp8_linears', 0)}, int8 {report.get('int8_linears', 0)}"
        + (
            f", resident {report['resident_weight_bytes'] / 1e9:.2f} GB"
            if "resident_weight_bytes" in report
            else ""
        )
    ]
    for r in report["batches"]:
        idle = r.get("idle_share")
        idle_text = "idle -" if idle is None else f"idle {100 * idle:4.1f}%"
        lines.append(
            f"  batch {r['batch']:>3} ctx {r['context_mean']:>5.0f}: {r['ms_per_step']:7.2f} ms "
            f"(floor {r['floor_ms']:.3f}, x{r['x_floor']:.1f}) {idle_text} "
            f"{r['output_tok_s']:>8.0f} tok/s{'' if r['decode_only'] else ' NOT decode-only'}"
        )
        if (ph := r.get("phase_ms")) is not None:  # the host's side: what the device waits on
            lines.append(
                f"    host {ph['host']:.2f} ms (wait {ph.get('wait', 0.0):.2f}): schedule "
                f"{ph.get('schedule', 0.0):.2f}, run {ph.get('run', 0.0):.2f} (prepare "
                f"{ph.get('prepare', 0.0):.2f}), sample {ph.get('sample', 0.0):.2f}, resolve "
                f"{ph.get('resolve', 0.0):.2f}, update {ph.get('update', 0.0):.2f}, append "
                f"{ph.get('append', 0.0):.2f}, other {ph.get('other', 0.0):.2f}"
            )
    return lines


def quant_lines(name: str, report: dict[str, Any]) -> list[str]:
    """``ops/bench/quant_gpu.py``: µs a projection, bf16 / FP8 _scaled_mm / 8-bit kernel."""
    lines = [f"{name}: us a call, bf16 / scaled_mm / int8 default (best tile) / e4m3 default"]
    for r in report["results"]:
        mm = f"{r['scaled_mm_us']:.1f}" if "scaled_mm_us" in r else "-"
        lines.append(
            f"  {r['shape']:>8} {r['rows']:>4}: {r['bf16_us']:.1f} / {mm} / "
            f"{r['int8_us'][r['default']]:.1f} ({r['best_us']:.1f} {r['best']}) / "
            f"{r['e4m3_default_us']:.1f}"
        )
    return lines


def summarize(out_dir: Path) -> list[str]:
    lines = []
    for path in sorted(out_dir.glob("*.json")):
        try:
            report = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            lines.append(f"{path.name}: unreadable ({e})")
            continue
        if isinstance(report, dict) and "systems" in report:
            lines += engine_lines(path.stem, report)
        elif isinstance(report, dict) and "batches" in report:
            lines += steps_lines(path.stem, report)
        elif isinstance(report, dict) and "results" in report:
            lines += quant_lines(path.stem, report)
        elif isinstance(report, dict) and "copy_gbps" in report:
            lines.append(f"{path.stem}: kernels.py grid, copy {report['copy_gbps']:.0f} GB/s")
        else:
            lines.append(f"{path.stem}: not a report this digest knows")
    return lines


def main(argv: Sequence[str] | None = None) -> list[str]:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        raise SystemExit("usage: gpu_summary.py OUT_DIR")
    lines = summarize(Path(args[0]))
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
