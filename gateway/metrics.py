"""``GET /metrics``: the gateway's Prometheus registry, as the worker's ``--metrics-port`` serves
its own: the batch runner's counters, and the in-gateway deliverer's metrics
(``gateway.webhooks.metrics``) when ``--webhooks`` runs one.

The route needs no token (the worker's and the deliverer's metrics ports need none either):
it names no tenant and no job, only counts. Counters are this process's since it started, as
Prometheus expects; with several gateways, sum them in the query.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

NS = "paternoster_gateway"
# A line's outcomes: submitted as a job; its job ended done (the output file) or not (the
# error file: error, expired, cancelled, lost); refused before any job (validation, the
# address policy, a payload over the limit).
LINE_OUTCOMES = ("submitted", "completed", "failed", "refused")


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.batch_lines = Counter(
            f"{NS}_batch_lines", "Batch lines by outcome, this gateway's runner", ["outcome"],
            registry=r,
        )  # fmt: skip
        self.batches = Counter(
            f"{NS}_batches", "Batches this gateway's runner moved to a final status", ["status"],
            registry=r,
        )  # fmt: skip
        for outcome in LINE_OUTCOMES:  # zeros exported from the start: rate() needs them
            self.batch_lines.labels(outcome=outcome)

    def lines(self, outcome: str, count: int = 1) -> None:
        if count:
            self.batch_lines.labels(outcome=outcome).inc(count)

    def batch_ended(self, status: str) -> None:
        self.batches.labels(status=status).inc()


router = APIRouter(tags=["status"])


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """Prometheus text: the gateway's registry, then the deliverer's when one runs here."""
    state = request.app.state
    body = generate_latest(state.metrics.registry)
    deliverer = getattr(state, "deliverer", None)
    if deliverer is not None and deliverer.metrics is not None:
        body += deliverer.metrics.render()
    return Response(body, media_type=CONTENT_TYPE_LATEST)
