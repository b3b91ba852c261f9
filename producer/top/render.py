"""A ``Snapshot`` as text: the frame ``paternoster top`` draws. Pure: no Redis, no terminal.

Each line fits ``width`` columns: a table first narrows its one flexible column (a worker's
name, a job's id) down to ``MIN_FLEX`` characters, then any line still too long is cut. With a
``height`` the job list is cut to what fits below the workers, newest first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from producer.fleet import StepCostReport
from producer.top.snapshot import JobRow, Latency, Snapshot, WorkerRow
from producer.webhook_stats import describe

MIN_FLEX = 8  # a job id cut to 7 characters and an ellipsis still tells ids apart by eye
GAP = "  "

WORKER_HEADERS = ("WORKER", "RUN/MAX", "WAIT", "KV%", "STEPS", "TOKENS", "TOK/S", "BEAT", "")
# What each worker thinks a step costs: its fitted terms, the last step measured and predicted,
# the target that step was sized to, and the targets in force.
STEP_HEADERS = (
    *("STEP COST", "BASE", "/DECODE", "/PREFILL", "/CONTEXT"),
    *("LAST", "PREDICTED", "TARGET", "TARGETS"),
)
JOB_HEADERS = ("JOB", "TENANT", "PRI", "STATE", "WAITING", "TOKENS", "TTFT", "TOTAL", "WORKER")
# Text columns are left-aligned, numbers right-aligned; the first column of each is flexible.
WORKER_LEFT = {0, 8}
JOB_LEFT = {0, 1, 3, 4, 8}
STEP_LEFT = {0, 8}


def render(
    snap: Snapshot, width: int = 100, height: int | None = None, interval_s: float | None = None
) -> str:
    """The whole frame, lines joined by newlines (no trailing one)."""
    width = max(width, 20)
    lines = [_title(snap, interval_s), _queues(snap.queue_depths), describe(snap.webhooks), ""]
    if snap.workers:
        lines.append(f"workers: {len(snap.workers)} live")
        rows = [_worker_cells(w) for w in snap.workers]
        lines += _table(WORKER_HEADERS, rows, width, WORKER_LEFT)
        costs = [_step_cells(w.name, w.step_cost) for w in snap.workers if w.step_cost]
        if costs:
            lines += ["", *_table(STEP_HEADERS, costs, width, STEP_LEFT)]
    else:
        lines.append("no live workers")
    lines += ["", _latency(snap.latency)]
    if snap.jobs:
        room = len(snap.jobs) if height is None else max(0, height - len(lines) - 2)
        shown = snap.jobs[:room]
        lines.append(f"recent jobs: {len(shown)} of {len(snap.jobs)} shown, newest first")
        lines += _table(JOB_HEADERS, [_job_cells(j) for j in shown], width, JOB_LEFT)
    else:
        lines.append("no recent jobs")
    return "\n".join(_cut(line, width) for line in lines)


def seconds(value: float | None) -> str:
    """``-``, milliseconds below one second, else seconds with two decimals."""
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"


def cost(value: float) -> str:
    """A step-cost term: microseconds below a millisecond (a context token's ``6.0us``), two
    decimals below 10 ms (a decode's ``1.50ms``), else as ``seconds``."""
    if 0 < value < 0.001:
        return f"{value * 1e6:.1f}us"
    if 0 < value < 0.01:
        return f"{value * 1000:.2f}ms"
    return seconds(value)


def _title(snap: Snapshot, interval_s: float | None) -> str:
    at = datetime.fromtimestamp(snap.taken_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    every = "" if interval_s is None else f", every {interval_s:g}s"
    return f"paternoster top: prefix {snap.prefix}, {at}{every}"


def _queues(depths: Mapping[str, int]) -> str:
    parts = [f"{band} {depth}" for band, depth in depths.items()]
    return f"queued: {', '.join(parts)}; total {sum(depths.values())}"


def _latency(lat: Latency) -> str:
    if not lat.finished:
        return "latency: no finished jobs among the recent ones"
    ttft = f"TTFT p50 {seconds(lat.ttft_p50_s)} p99 {seconds(lat.ttft_p99_s)}"
    e2e = f"end-to-end p50 {seconds(lat.e2e_p50_s)} p99 {seconds(lat.e2e_p99_s)}"
    return f"latency over {lat.finished} done: {ttft}; {e2e}"


def _worker_cells(w: WorkerRow) -> list[str]:
    rate = "-" if w.tokens_per_s is None else f"{w.tokens_per_s:.1f}"
    return [
        w.name,
        f"{w.running}/{w.max_num_seqs}",
        str(w.waiting),
        f"{w.kv_usage * 100:.1f}",
        str(w.steps),
        str(w.generated_tokens),
        rate,
        f"{w.heartbeat_age_s:.1f}s",
        "draining" if w.draining else "",
    ]


def _step_cells(name: str, c: StepCostReport) -> list[str]:
    terms = (c.base_s, c.per_decode_s, c.per_prefill_token_s, c.per_context_token_s)
    target = cost(c.target_s) if c.target_s else "none"
    return [name, *map(cost, (*terms, c.measured_s, c.predicted_s)), target, c.targets]


def _job_cells(j: JobRow) -> list[str]:
    wait = ""
    if j.wait_reason is not None:
        wait = j.wait_reason if j.position is None else f"{j.wait_reason} #{j.position}"
    return [
        j.job_id,
        j.tenant or "-",
        "-" if j.priority is None else str(j.priority),
        j.state,
        wait,
        "-" if j.completion_tokens is None else str(j.completion_tokens),
        seconds(j.ttft_s),
        seconds(j.total_s),
        j.worker or "-",
    ]


def _table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], width: int, left: set[int]
) -> list[str]:
    """Aligned columns; column 0 narrows (to ``MIN_FLEX``) before lines get cut at ``width``."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    total = sum(widths) + len(GAP) * (len(widths) - 1)
    if total > width:
        widths[0] = min(widths[0], max(MIN_FLEX, widths[0] - (total - width)))

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, (cell, w) in enumerate(zip(cells, widths, strict=True)):
            cell = _cut(cell, w)
            out.append(cell.ljust(w) if i in left else cell.rjust(w))
        return GAP.join(out).rstrip()

    return [line(headers), *(line(r) for r in rows)]


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
