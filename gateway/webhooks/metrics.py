"""The deliverer's Prometheus metrics, on a registry of its own (as ``WorkerMetrics`` does),
served with /health by the worker's ``MetricsServer`` (``--metrics-port``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.webhooks.sender import Attempt

NS = "paternoster_webhook"
# One attempt: 1 ms (a receiver on loopback) to the 10 s default request timeout and past it.
ATTEMPT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class WebhookMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.deliveries = Counter(
            f"{NS}_deliveries", "Deliveries ended, by outcome", ["outcome"], registry=r
        )
        self.attempts = Counter(
            f"{NS}_attempts", "Delivery attempts, by result", ["result"], registry=r
        )
        self.attempt_seconds = Histogram(
            f"{NS}_attempt_seconds",
            "One attempt, connect to answer",
            buckets=ATTEMPT_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            f"{NS}_in_flight", "Deliveries this deliverer holds (sending or waiting)", registry=r
        )

    def attempt(self, attempt: Attempt) -> None:
        self.attempts.labels(result=attempt.result).inc()
        if attempt.result != "refused":  # nothing was sent: no latency to count
            self.attempt_seconds.observe(attempt.seconds)

    def ended(self, outcome: str) -> None:
        self.deliveries.labels(outcome=outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
