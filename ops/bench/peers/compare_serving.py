"""Side-by-side table of ``load.py`` (ours) and ``serve_load.py`` (peers) reports, same workload.

    python ops/bench/peers/compare_serving.py ours=R/ours/report.json vllm=R/vllm/report.json \\
        llama.cpp=R/llama/report.json [--out R/serving.json]

For each offered rate: completed jobs/s, output tok/s and ours over the system's, TTFT
p50/p99 for short chats and for all jobs, with ours' chat p99 over the system's (below 1: ours
answers chats sooner), and the short chats' TPOT p50/p99 with ours' p99 over the system's.
``--plot-dir`` writes the chats' TTFT and TPOT CDFs per rate. The reports must come from the same
mix, seed and job count; the workload totals are compared to make sure.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def load_runs(path: Path) -> dict[float, dict[str, Any]]:
    return {float(r["rate_per_s"]): r for r in json.loads(path.read_text())["runs"]}


def p99_ratio(ours: dict[str, Any], theirs: dict[str, Any]) -> float | None:
    """Ours' p99 over the system's, where both have one."""
    return ours["p99"] / theirs["p99"] if theirs.get("p99") and ours.get("p99") else None


def row(name: str, run: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    o = run["overall"]
    chat = run["classes"].get("chat", {}).get("ttft_s", {})
    ours_chat = ours["classes"].get("chat", {}).get("ttft_s", {})
    tpot = run["classes"].get("chat", {}).get("tpot_s", {})
    ours_tpot = ours["classes"].get("chat", {}).get("tpot_s", {})
    return {
        "system": name,
        "completed_jobs_per_s": o["completed_jobs_per_s"],
        "output_tok_s": o["output_tok_s"],
        "ours_tok_s_ratio": ours["overall"]["output_tok_s"] / o["output_tok_s"],
        "chat_ttft_p50_s": chat.get("p50"),
        "chat_ttft_p99_s": chat.get("p99"),
        "ours_chat_p99_ratio": p99_ratio(ours_chat, chat),
        "chat_tpot_p50_s": tpot.get("p50"),
        "chat_tpot_p99_s": tpot.get("p99"),
        "ours_chat_tpot_p99_ratio": p99_ratio(ours_tpot, tpot),
        "ttft_p99_s": o["ttft_s"]["p99"],
        "tpot_p50_s": o["tpot_s"]["p50"],
        "outcomes": o["outcomes"],
    }


Runs = dict[str, dict[float, dict[str, Any]]]  # system -> offered rate -> load.py-style run


def compare(runs: Runs) -> dict[str, list[dict[str, Any]]]:
    if "ours" not in runs:
        raise SystemExit("one report must be named ours")
    table: dict[str, list[dict[str, Any]]] = {}
    for rate, ours in sorted(runs["ours"].items()):
        rows = []
        for name, by_rate in runs.items():
            run = by_rate.get(rate)
            if run is None:
                continue
            if run["workload"] != ours["workload"]:
                raise SystemExit(f"{name} at {rate:g}/s ran another workload than ours")
            rows.append(row(name, run, ours))
        table[f"{rate:g}"] = rows
    return table


def chat_ttft_s(job: dict[str, Any]) -> float | None:
    times = job["token_times_s"]
    return times[0] - job["submit_s"] if times and job["submit_s"] is not None else None


def chat_tpot_s(job: dict[str, Any]) -> float | None:
    """Mean time between a job's tokens after its first: the TPOT its reader saw."""
    times = job["token_times_s"]
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None


# name in the file, axis label, the job's value
CDF_METRICS = (
    ("ttft", "time to first token, s", chat_ttft_s),
    ("tpot", "time per output token after the first, s", chat_tpot_s),
)


def plot_cdfs(runs: Runs, out: Path) -> list[Path]:
    """Per rate and metric (TTFT, TPOT), the CDF of each system's short chats: one PNG each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    written = []
    for rate in sorted(runs["ours"]):
        for tag, label, value in CDF_METRICS:
            fig, ax = plt.subplots(figsize=(6, 4))
            for name, by_rate in runs.items():
                jobs = by_rate.get(rate, {}).get("jobs", [])
                xs = sorted(v for j in jobs if j["klass"] == "chat" and (v := value(j)) is not None)
                if xs:
                    ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=name)
            ax.set_xscale("log")
            # Plain decimals at 1, 2 and 5 per decade: matplotlib's labelled minor ticks overlap
            # on a 0.1-10 s span.
            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set(xlabel=label, ylabel="share of chat jobs")
            ax.set_title(f"short chats, {rate:g} jobs/s offered")
            ax.legend()
            path = out / f"chat_{tag}_cdf_rate{f'{rate:g}'.replace('.', 'p')}.png"
            fig.savefig(path, dpi=100, bbox_inches="tight")
            plt.close(fig)
            written.append(path)
    return written


def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def print_table(table: dict[str, list[dict[str, Any]]]) -> None:
    print("| rate/s | system | done jobs/s | out tok/s | ours ÷ system | chat TTFT p50 s "
          "| chat TTFT p99 s | ours chat p99 ÷ system | chat TPOT p50 s | chat TPOT p99 s "
          "| ours chat TPOT p99 ÷ system | all TTFT p99 s | TPOT p50 s |")  # fmt: skip
    print("| ---: | --- |" + " ---: |" * 11)
    for rate, rows in table.items():
        for r in rows:
            print(
                f"| {rate} | {r['system']} | {r['completed_jobs_per_s']:.3f} | "
                f"{r['output_tok_s']:.1f} | {fmt(r['ours_tok_s_ratio'])} | "
                f"{fmt(r['chat_ttft_p50_s'])} | {fmt(r['chat_ttft_p99_s'])} | "
                f"{fmt(r['ours_chat_p99_ratio'])} | {fmt(r['chat_tpot_p50_s'], 3)} | "
                f"{fmt(r['chat_tpot_p99_s'], 3)} | {fmt(r['ours_chat_tpot_p99_ratio'])} | "
                f"{fmt(r['ttft_p99_s'])} | "
                f"{fmt(r['tpot_p50_s'], 3)} |"
            )


def main(argv: Sequence[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="+", help="NAME=report.json; one NAME must be ours")
    p.add_argument("--out", type=Path)
    p.add_argument("--plot-dir", type=Path, help="write chat TTFT and TPOT CDFs per rate here")
    args = p.parse_args(argv)
    reports = {}
    for item in args.reports:
        name, _, path = item.partition("=")
        if not path:
            p.error(f"expected NAME=PATH, got {item!r}")
        reports[name] = Path(path)
    runs = {name: load_runs(path) for name, path in reports.items()}
    table = compare(runs)
    print_table(table)
    if args.out:
        args.out.write_text(json.dumps(table, indent=1))
    if args.plot_dir:
        args.plot_dir.mkdir(parents=True, exist_ok=True)
        for path in plot_cdfs(runs, args.plot_dir):
            print(f"wrote {path}")
    return table


if __name__ == "__main__":
    main()
