"""Turns one load run (the client's job records and the /metrics samples) into its report.

Per job, on the client's clock (``load_client.py``), from the moment its submit returned:
TTFT to the first token; TPOT = (last token - first token) / (tokens - 1), for ``done`` jobs
with 2 or more tokens (as ``paternoster_time_per_output_token_seconds``); end-to-end latency to
the terminal event, ``done`` jobs only; queue wait from the ``started`` event (submit to taken
by the worker, on the Redis server's clock).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

OUTCOMES = ("done", "cancelled", "error", "expired", "rejected", "timeout")
LATENCIES = ("ttft_s", "tpot_s", "e2e_s", "queue_s")


def percentiles(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, mean and p50/p90/p99 (linear interpolation; None when there is no value)."""
    if not values:
        return {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(np.asarray(values, dtype=float), [50, 90, 99])
    return {
        "n": len(values),
        "mean": float(np.mean(values)),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
    }


def job_latencies(rec: dict[str, Any]) -> dict[str, float | None]:
    times, submit = rec["token_times_s"], rec["submit_s"]
    done = rec["outcome"] == "done"
    out: dict[str, float | None] = dict.fromkeys(LATENCIES)
    if times and submit is not None:
        out["ttft_s"] = times[0] - submit
    if done and len(times) >= 2:
        out["tpot_s"] = (times[-1] - times[0]) / (len(times) - 1)
    if done and submit is not None and rec["end_s"] is not None:
        out["e2e_s"] = rec["end_s"] - submit
    out["queue_s"] = rec["queued_s"]
    return out


def cancellations(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Jobs the client meant to cancel, and what came of it. Honoured: it ended ``cancelled``
    with fewer tokens than its length (a cancel that loses the race to the last token is not)."""
    planned = [r for r in records if r["cancel_after_tokens"] is not None]
    sent = [r for r in planned if r["cancel_sent_s"] is not None]
    honoured = [
        r for r in sent if r["outcome"] == "cancelled" and len(r["token_times_s"]) < r["max_tokens"]
    ]
    late = [
        sum(t > r["cancel_sent_s"] for t in r["token_times_s"]) for r in sent
    ]  # tokens read after the cancel went out: the worker stops within a step
    to_end = [r["end_s"] - r["cancel_sent_s"] for r in sent if r["end_s"] is not None]
    return {
        "planned": len(planned),
        "sent": len(sent),
        "honoured": len(honoured),
        "tokens_after_cancel": percentiles(late),
        "cancel_to_end_s": percentiles(to_end),
    }


def summarize_jobs(records: Sequence[dict[str, Any]], duration_s: float) -> dict[str, Any]:
    """Latency percentiles, outcomes and throughput of a set of jobs over ``duration_s``."""
    lat = [job_latencies(r) for r in records]
    outcomes = {o: sum(r["outcome"] == o for r in records) for o in OUTCOMES}
    tokens = sum(len(r["token_times_s"]) for r in records)
    return {
        "jobs": len(records),
        "outcomes": outcomes,
        "output_tokens": tokens,
        **{k: percentiles([v for x in lat if (v := x[k]) is not None]) for k in LATENCIES},
        "completed_jobs_per_s": outcomes["done"] / duration_s if duration_s > 0 else 0.0,
        "output_tok_s": tokens / duration_s if duration_s > 0 else 0.0,
    }


def kv_timeline(samples: Sequence[dict[str, Any]], start_unix: float) -> dict[str, Any]:
    """The sampled KV usage, batch and queue, on the client's clock, and their summary."""
    rows = [
        {
            "t_s": s["t_unix"] - start_unix,
            **{k: s.get(k) for k in ("kv_usage", "kv_used_blocks", "running", "waiting")},
        }
        for s in samples
    ]
    usage = [r["kv_usage"] for r in rows if r["kv_usage"] is not None and r["t_s"] >= 0]
    return {
        "samples": rows,
        "kv_total_blocks": samples[-1].get("kv_total_blocks") if samples else None,
        "mean_kv_usage": float(np.mean(usage)) if usage else None,
        "max_kv_usage": max(usage) if usage else None,
        "max_running": max((r["running"] or 0 for r in rows), default=0),
        "max_waiting": max((r["waiting"] or 0 for r in rows), default=0),
    }


def summarize_run(
    client_out: dict[str, Any], samples: Sequence[dict[str, Any]], delta: dict[str, Any]
) -> dict[str, Any]:
    """The run's report: overall and per class, cancellations, worker counters, KV timeline.
    ``duration_s`` runs from the client's start (the arrivals' time 0) to the last event."""
    records = client_out["jobs"]
    ends = [r["end_s"] for r in records if r["end_s"] is not None]
    duration = max(ends, default=client_out["wall_s"])
    classes = sorted({r["klass"] for r in records})
    submitted = [r for r in records if r["submit_s"] is not None]
    lag = [r["submit_s"] - r["arrival_s"] for r in submitted]
    return {
        "duration_s": duration,
        "offered_jobs_per_s": len(records) / max(r["arrival_s"] for r in records)
        if records and max(r["arrival_s"] for r in records) > 0
        else None,
        "overall": summarize_jobs(records, duration),
        "classes": {
            c: summarize_jobs([r for r in records if r["klass"] == c], duration) for c in classes
        },
        "cancellations": cancellations(records),
        "rejections": sum(r["outcome"] == "rejected" for r in records),
        "submit_lag_s": percentiles(lag),  # open-loop fidelity: submitted late by this much
        "preemptions": delta.get("preemptions", {}),
        "worker_rejections": delta.get("rejected", {}),
        "worker_steps": delta.get("steps"),
        "worker_generated_tokens": delta.get("generated_tokens"),
        "kv": kv_timeline(samples, client_out["start_unix"]),
        "client_reads": client_out["reads"],
    }
