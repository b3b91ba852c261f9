"""The worker's Prometheus metrics; ``serve()`` exposes them with /health (``metrics_server``).

Each ``WorkerMetrics`` owns its registry (tests build many; the global one would collide), and
every label takes values from a short set the code names (band, outcome, reason, error code):
never a job id or tenant, so one worker exports about 400 series (most of them buckets).
Histogram buckets cover a 2-core CPU (BENCHMARKS.md: ~217 ms per step, TTFT up to 76 s on a
17k-token burst) through an H200 (decode steps of a few ms), so quantiles stay resolvable on both.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)

from producer.keys import BANDS
from worker.engine.wait_reasons import WaitReason
from worker.service.metrics_server import MetricsServer
from worker.service.step_cost_metrics import StepCostGauges

NS = "paternoster"
STALE_AFTER_S = 30.0  # the loop marks itself alive each step or 50 ms idle wait: 600x margin
WAITING_REASONS = tuple(reason.value for reason in WaitReason)
PREEMPT_REASONS = ("priority", "kv_cache_full")
# Queue time: 1 ms (an idle worker takes a job within one read) to 10 min (a batch-band backlog).
QUEUED_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# TTFT: 5 ms (H200 prefill of a short prompt) to 120 s (CPU: 76 s max measured on a 17k burst).
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120)
# End to end: 50 ms (a few tokens on a GPU) to 30 min (2,000 tokens on a CPU at ~2 tok/s each).
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800)
# Per output token and per step: 1 ms (H200 decode, small model) to 2.5 s (a CPU prefill step of
# 512 tokens); dense at 5-250 ms, where both a GPU at batch 64 and the CPU's 217 ms/step land.
STEP_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5
)  # fmt: skip
# Sequences per step: CPU runs max_num_seqs 8, the GPU default is 64; up to 256 for big KV.
BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
# Tokens per step: 1 (one decode) up to the 512 default budget, and 8k for raised budgets.
STEP_TOKEN_BUCKETS = (1, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048, 4096, 8192)
COMPLETION_BUCKETS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@dataclass(frozen=True)
class _Define:
    """Metric constructors bound to one registry and the ``paternoster_`` namespace."""

    r: CollectorRegistry

    def gauge(self, name: str, doc: str, *labels: str) -> Gauge:
        return Gauge(f"{NS}_{name}", doc, labels, registry=self.r)

    def counter(self, name: str, doc: str, *labels: str) -> Counter:
        return Counter(f"{NS}_{name}", doc, labels, registry=self.r)

    def histogram(self, name: str, doc: str, buckets: Sequence[float], *labels: str) -> Histogram:
        return Histogram(f"{NS}_{name}", doc, labels, buckets=buckets, registry=self.r)


class WorkerMetrics:
    """Every metric one worker exports. Thread-safe: prometheus_client locks each child."""

    def __init__(
        self,
        worker: str,
        registry: CollectorRegistry | None = None,
        *,
        stale_after_s: float = STALE_AFTER_S,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.stale_after_s = stale_after_s
        self._watched: tuple[threading.Thread, ...] = ()  # helper threads /health checks
        self._alive_at: float | None = None  # time.monotonic() of the loop's last mark_alive
        self._reported: set[str] = set()  # waiting reasons set since the previous step
        self._reasons = set(WAITING_REASONS)  # every reason ever set: each is zeroed when absent
        d = _Define(self.registry)
        Info(f"{NS}_worker", "This worker's consumer name.", registry=d.r).info({"worker": worker})
        self._define_engine(d)
        self._define_jobs(d)
        self._define_io(d)
        self.step_cost = StepCostGauges(self.registry, NS)  # follow(the engine's scheduler)
        for band in BANDS:  # every series from the start: rate() and absent() need no first event
            self.jobs_held(band=band, waiting=0, running=0)
            self.queue_depth(band=band, depth=0)
            for histogram in (self._queued_s, self._ttft, self._e2e, self._tpot, self._completion):
                histogram.labels(band=band)
        for reason in WAITING_REASONS:
            self._waiting.labels(reason=reason).set(0)
        for reason in PREEMPT_REASONS:
            self._preempted.labels(reason=reason)

    def _define_engine(self, d: _Define) -> None:
        self._running = d.gauge("running_sequences", "Sequences in the running batch.")
        self._waiting_seqs = d.gauge("waiting_sequences", "Sequences in the engine, not running.")
        self._kv_used = d.gauge("kv_cache_used_blocks", "KV cache blocks in use.")
        self._kv_total = d.gauge("kv_cache_total_blocks", "KV cache blocks in all.")
        self._kv_ratio = d.gauge("kv_cache_usage_ratio", "Used / total KV cache blocks.")
        self._batch = d.histogram("step_batch_size_sequences", "Seqs per step.", BATCH_BUCKETS)
        self._step_tokens = d.histogram("step_tokens", "Tokens per step.", STEP_TOKEN_BUCKETS)
        self._step_s = d.histogram("step_duration_seconds", "One engine step.", STEP_BUCKETS)
        self._steps = d.counter("steps_total", "Engine steps.")
        self._generated = d.counter("generated_tokens_total", "Tokens sampled, for all jobs.")
        self._waiting = d.gauge("waiting_jobs", "Jobs waiting in the worker, by why.", "reason")
        self._preempted = d.counter("preemptions_total", "Sequences preempted, by why.", "reason")
        self._prefix_queried = d.counter(
            "prefix_cache_queried_tokens_total", "Prompt tokens looked up in the prefix cache."
        )
        self._prefix_hit = d.counter(
            "prefix_cache_hit_tokens_total", "Prompt tokens found in the prefix cache."
        )

    def _define_jobs(self, d: _Define) -> None:
        self._held = d.gauge("held_jobs", "Jobs inside this worker.", "band", "state")
        self._queued = d.gauge("queued_jobs", "Jobs queued in Redis, not yet taken.", "band")
        self._queued_s = d.histogram(
            "queue_time_seconds", "Submit to taken.", QUEUED_BUCKETS, "band"
        )
        self._ttft = d.histogram(
            "time_to_first_token_seconds", "Submit to first token.", TTFT_BUCKETS, "band"
        )
        self._e2e = d.histogram(
            "e2e_latency_seconds", "Submit to done (done jobs).", E2E_BUCKETS, "band"
        )
        self._tpot = d.histogram(
            "time_per_output_token_seconds", "Per token after the first.", STEP_BUCKETS, "band"
        )
        self._completion = d.histogram(
            "completion_tokens", "Tokens per finished job.", COMPLETION_BUCKETS, "band"
        )
        self._finished = d.counter(
            "jobs_finished_total", "Jobs ended.", "band", "outcome", "finish_reason"
        )
        self._rejected = d.counter("jobs_rejected_total", "Jobs refused at intake.", "code")

    def _define_io(self, d: _Define) -> None:
        self._round_trips = d.counter("publisher_round_trips_total", "Pipelines sent to Redis.")
        self._commands = d.counter("publisher_commands_total", "Redis commands published.")
        self._retries = d.counter("publisher_retries_total", "Pipelines sent again.")
        age = d.gauge("loop_alive_age_seconds", "Since the model loop last ran; NaN before.")
        age.set_function(lambda: math.nan if (a := self.alive_age_s()) is None else a)

    # -- the model loop, once per step -------------------------------------------------------

    def step(
        self,
        *,
        num_running: int,
        num_waiting: int,
        num_batched_tokens: int,
        num_generated_tokens: int,
        kv_blocks_used: int,
        kv_blocks_total: int,
        step_s: float,
    ) -> None:
        """One engine step ran. Also a proof of life, and the boundary for ``waiting_reason``:
        reasons not set since the previous step go to 0."""
        self.mark_alive()
        self._running.set(num_running)
        self._waiting_seqs.set(num_waiting)
        self._kv_used.set(kv_blocks_used)
        self._kv_total.set(kv_blocks_total)
        self._kv_ratio.set(kv_blocks_used / kv_blocks_total if kv_blocks_total else 0.0)
        self._batch.observe(num_running)
        self._step_tokens.observe(num_batched_tokens)
        self._step_s.observe(step_s)
        self._steps.inc()
        self._generated.inc(num_generated_tokens)
        for reason in self._reasons - self._reported:
            self._waiting.labels(reason=reason).set(0)
        self._reported.clear()

    def waiting_reason(self, *, reason: str, count: int) -> None:
        """Jobs waiting for ``reason`` now; a reason not set again before the next step reads 0."""
        self._waiting.labels(reason=reason).set(count)
        self._reported.add(reason)
        self._reasons.add(reason)

    def preempted(self, *, reason: str, count: int = 1) -> None:
        self._preempted.labels(reason=reason).inc(count)

    def prefix_cache(self, *, queried_tokens: int, hit_tokens: int) -> None:
        self._prefix_queried.inc(queried_tokens)
        self._prefix_hit.inc(hit_tokens)

    def mark_alive(self) -> None:
        """The model loop ran an iteration (a step or an idle wait); /health reads this."""
        self._alive_at = time.monotonic()

    def alive_age_s(self) -> float | None:
        return None if self._alive_at is None else time.monotonic() - self._alive_at

    # -- jobs ---------------------------------------------------------------------------------

    def jobs_held(self, *, band: str, waiting: int, running: int) -> None:
        self._held.labels(band=band, state="waiting").set(waiting)
        self._held.labels(band=band, state="running").set(running)

    def queue_depth(self, *, band: str, depth: int) -> None:
        """Redis-wide: every worker reports the same number, so aggregate with max, not sum."""
        self._queued.labels(band=band).set(depth)

    def job_started(self, *, band: str, queued_s: float) -> None:
        self._queued_s.labels(band=band).observe(queued_s)

    def first_token(self, *, band: str, ttft_s: float) -> None:
        self._ttft.labels(band=band).observe(ttft_s)

    def job_finished(
        self,
        *,
        band: str,
        outcome: str,
        finish_reason: str | None,
        e2e_s: float,
        tpot_s: float | None,
        completion_tokens: int,
    ) -> None:
        """A job ended (done|error|cancelled|expired). Latency histograms take done jobs only:
        a cancelled job's length is the client's choice, not the service's speed."""
        self._finished.labels(band=band, outcome=outcome, finish_reason=finish_reason or "").inc()
        self._completion.labels(band=band).observe(completion_tokens)
        if outcome == "done":
            self._e2e.labels(band=band).observe(e2e_s)
            if tpot_s is not None:
                self._tpot.labels(band=band).observe(tpot_s)

    def rejected(self, *, code: str) -> None:
        self._rejected.labels(code=code).inc()

    def publish(self, *, round_trips: int, commands: int, retries: int) -> None:
        self._round_trips.inc(round_trips)
        self._commands.inc(commands)
        self._retries.inc(retries)

    # -- exposition ---------------------------------------------------------------------------

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def watch(self, threads: Sequence[threading.Thread]) -> None:
        """Started helper threads whose death fails /health: a worker whose intake died still
        steps and heartbeats, but never takes another job."""
        self._watched = tuple(threads)

    def health(self) -> tuple[int, dict[str, object]]:
        """(HTTP status, body): 200 while the loop ran within ``stale_after_s`` and every
        watched helper thread lives, else 503."""
        age = self.alive_age_s()
        if age is None:
            return 503, {"status": "starting", "last_step_age_s": None}
        dead = [t.name for t in self._watched if not t.is_alive()]
        if dead:
            return 503, {"status": "thread_died", "dead_threads": dead, "last_step_age_s": age}
        ok = age <= self.stale_after_s
        body: dict[str, object] = {
            "status": "ok" if ok else "stale",
            "last_step_age_s": round(age, 3),
        }
        return (200 if ok else 503), body

    def serve(self, *, port: int, host: str = "127.0.0.1") -> MetricsServer:
        """Serve /metrics and /health on a daemon thread; port 0 picks a free one (``.port``).
        Loopback unless asked: metrics name tenants and jobs (``--metrics-host 0.0.0.0``)."""
        return MetricsServer(host, port, render=self.render, health=self.health)
