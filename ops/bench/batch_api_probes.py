"""The interactive probes of ``batch_api.py``: TTFT of one request at a time, idle and during
a batch, and the report of their percentiles."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import httpx
import openai


def p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def summary(ttfts: Sequence[float]) -> dict[str, float | int]:
    ordered = sorted(ttfts)
    return {"n": len(ordered), "p50_ms": 1000 * ordered[len(ordered) // 2],
            "p99_ms": 1000 * p99(ordered), "max_ms": 1000 * ordered[-1]}  # fmt: skip


class Probes:
    """Interactive requests, one at a time, two kinds: an OpenAI streamed completion (its job
    is of the ``default`` band; TTFT measured by the client, to the first text chunk) and a
    native job of the ``interactive`` band (TTFT from its ``timings``, the server's clock:
    submit to first token)."""

    KINDS = ("openai_default_band", "native_interactive_band")

    def __init__(self, base_url: str) -> None:
        self.openai = openai.OpenAI(api_key="x", base_url=f"{base_url}/v1", max_retries=0,
                                    timeout=120)  # fmt: skip
        self.http = httpx.Client(base_url=base_url, timeout=120)
        self.sent = 0
        self.phase = "idle"  # the run sets "during_batch" when the batch starts
        # Native probes' TTFT split (server clock): submit -> a worker claimed it (intake:
        # the job waiting in Redis) and claimed -> first token (engine admission and steps).
        self.split: dict[str, list[tuple[float, float]]] = {}
        # Every probe, for ``batch_api_trace``: phase, kind, job id, sent and first text at
        # (time.time(); the native probe's first token is read from the server, None here).
        self.sent_jobs: list[tuple[str, str, str, float, float | None]] = []

    def ttft_s(self, kind: str) -> float:
        self.sent += 1
        prompt = f"Probe {self.sent}:"
        sent_at = time.time()
        if kind == "native_interactive_band":
            body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "priority": "interactive"}
            job_id = self.http.post("/v1/jobs", json=body).json()["job_id"]
            self.sent_jobs.append((self.phase, kind, job_id, sent_at, None))
            result = self.http.get(f"/v1/jobs/{job_id}/result", params={"timeout_s": 60}).json()
            timings = result["timings"]
            queued_s, ttft_s = float(timings["queued_s"]), float(timings["ttft_s"])
            self.split.setdefault(self.phase, []).append((queued_s, ttft_s - queued_s))
            return ttft_s
        start = time.perf_counter()
        stream = self.openai.completions.create(model="m", prompt=prompt, max_tokens=4,
                                                temperature=0, stream=True)  # fmt: skip
        first, first_at, job_id = None, 0.0, ""
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].text:
                first, first_at = time.perf_counter() - start, time.time()
                job_id = chunk.id.partition("-")[2]  # cmpl-<job id>
        assert first is not None, "a probe produced no text"
        self.sent_jobs.append((self.phase, kind, job_id, sent_at, first_at))
        return first


def ttft_report(
    idle: list[tuple[str, float, float]], busy: list[tuple[str, float, float]], kill_s: float
) -> dict[str, Any]:
    """Per probe kind: TTFT idle, during the batch (and before / from the kill), p99 ratio."""
    report: dict[str, Any] = {}
    for kind in Probes.KINDS:
        during = [(sent, t) for k, sent, t in busy if k == kind]
        phases = {"idle": [t for k, _, t in idle if k == kind],
                  "during_batch": [t for _, t in during],
                  "before_kill": [t for sent, t in during if sent < kill_s],
                  "from_kill": [t for sent, t in during if sent >= kill_s]}  # fmt: skip
        got: dict[str, Any] = {name: summary(ts) for name, ts in phases.items() if ts}
        got["p99_ratio"] = got["during_batch"]["p99_ms"] / got["idle"]["p99_ms"]
        report[kind] = got
    return report


def split_report(probes: Probes) -> dict[str, Any]:
    """Per phase, the native probes' intake wait and engine time (p50/p99 ms each)."""
    return {phase: {"intake": summary([q for q, _ in pairs]),
                    "engine": summary([e for _, e in pairs])}
            for phase, pairs in probes.split.items()}  # fmt: skip
