"""The load report's figures, as PNGs beside it (matplotlib's Agg backend: no display needed).

- ``latency_cdf_rate<r>.png``: per rate, CDFs of TTFT, TPOT and end-to-end latency per class;
- ``throughput.png``: completed jobs/s and output tokens/s against the offered rate, with the
  offered rate itself as the line a worker keeping up would follow;
- ``kv_usage.png``: KV cache usage, and running and waiting sequences, over each run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless CI and ssh sessions have no display

import matplotlib.pyplot as plt
import numpy as np
from load_report import job_latencies

CDF_METRICS = (
    ("ttft_s", "time to first token (s)"),
    ("tpot_s", "time per output token (s)"),
    ("e2e_s", "end-to-end latency (s)"),
)


def _rate_tag(rate: float) -> str:
    return f"{rate:g}".replace(".", "p")


def save(fig: Any, title: str, path: Path) -> Path:
    """``fig`` under ``title`` as a PNG at ``path``, closed (pyplot keeps every open figure)."""
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_cdfs(run: dict[str, Any], out_dir: Path) -> Path:
    fig, axes = plt.subplots(1, len(CDF_METRICS), figsize=(15, 4.2))
    lat = [(r["klass"], job_latencies(r)) for r in run["jobs"]]
    for ax, (key, label) in zip(axes, CDF_METRICS, strict=True):
        for klass in sorted({k for k, _ in lat}):
            values = np.sort([x[key] for k, x in lat if k == klass and x[key] is not None])
            if len(values):
                ax.step(
                    values,
                    np.arange(1, len(values) + 1) / len(values),
                    where="post",
                    label=f"{klass} (n={len(values)})",
                )
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of jobs")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    rate = run["rate_per_s"]
    title = f"latency CDFs per class at {rate:g} jobs/s offered"
    return save(fig, title, out_dir / f"latency_cdf_rate{_rate_tag(rate)}.png")


def throughput(runs: Sequence[dict[str, Any]], out_dir: Path) -> Path:
    rates = [r["rate_per_s"] for r in runs]
    jobs = [r["overall"]["completed_jobs_per_s"] for r in runs]
    tokens = [r["overall"]["output_tok_s"] for r in runs]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ax.plot(rates, rates, ":", color="grey", label="offered")
    ax.plot(rates, jobs, "o-", label="completed jobs/s")
    ax.set_xlabel("offered load (jobs/s)")
    ax.set_ylabel("completed jobs/s")
    ax.grid(alpha=0.3)
    twin = ax.twinx()
    twin.plot(rates, tokens, "s--", color="tab:red", label="output tokens/s")
    twin.set_ylabel("output tokens/s")
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    return save(fig, "throughput against offered load", out_dir / "throughput.png")


def kv_usage(runs: Sequence[dict[str, Any]], out_dir: Path) -> Path:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for run in runs:
        rows = [s for s in run["kv"]["samples"] if s["kv_usage"] is not None]
        t = [s["t_s"] for s in rows]
        label = f"{run['rate_per_s']:g} jobs/s"
        top.plot(t, [100 * s["kv_usage"] for s in rows], label=label)
        (line,) = bottom.plot(t, [s["running"] for s in rows], label=f"running, {label}")
        bottom.plot(
            t, [s["waiting"] for s in rows], "--", color=line.get_color(), label=f"waiting, {label}"
        )
    top.set_ylabel("KV cache used (%)")
    top.set_ylim(bottom=0)  # autoscaled above: a big pool under light load stays near 0%
    bottom.set_ylabel("sequences")
    bottom.set_xlabel("time since the client started: arrivals count from here (s)")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save(fig, "KV cache usage and batch over time", out_dir / "kv_usage.png")


def write_all(runs: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Every figure of the report; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        *(latency_cdfs(r, out_dir) for r in runs),
        throughput(runs, out_dir),
        kv_usage(runs, out_dir),
    ]
