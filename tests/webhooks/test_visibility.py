"""What the gateway shows of webhooks and batches: ``/v1/status``'s ``webhooks`` counts (the
same reads as ``paternoster webhooks stats``) and ``/metrics``: the batch runner's counters,
and the deliverer's when ``--webhooks`` runs one in the gateway."""

from __future__ import annotations

import time
from typing import Any

from gateway.config import GatewayConfig
from producer.keys import Keys
from tests.gateway.conftest import serve, stop
from tests.gateway.test_batches import _client, completion_line, start_batch, wait_status
from tests.webhooks.conftest import cancelled_jobs


def _sample(metrics: str, name: str) -> float:
    """One sample's value from Prometheus text (``name`` with its labels)."""
    lines = [line for line in metrics.splitlines() if line.startswith(name + " ")]
    assert len(lines) == 1, f"{name} not in /metrics"
    return float(lines[0].split()[-1])


def test_status_counts_the_webhook_queue(redis_url: str, key_prefix: str, client: Any) -> None:
    keys = Keys(key_prefix)
    served = serve(GatewayConfig(redis_url=redis_url, prefix=key_prefix))
    try:
        with served.client() as http:
            empty = http.get("/v1/status").json()["webhooks"]  # no stream yet
            cancelled_jobs(redis_url, key_prefix, "http://127.0.0.1:9/hook", 3)
            client.xgroup_create(keys.webhooks, keys.webhook_group, id="0")
            client.xreadgroup(keys.webhook_group, "d1", {keys.webhooks: ">"}, count=1)
            client.xadd(keys.webhook_dead, {"id": "j", "reason": "test"})
            counts = http.get("/v1/status").json()["webhooks"]
    finally:
        stop(served)
    assert empty == {"to_deliver": 0, "in_hand": 0, "dead": 0}
    assert counts == {"to_deliver": 3, "in_hand": 1, "dead": 1}


def test_metrics_count_batch_lines_and_the_deliverer(redis_url: str, key_prefix: str) -> None:
    config = GatewayConfig(redis_url=redis_url, prefix=key_prefix, webhooks=True,
                           batch_poll_s=0.05)  # fmt: skip
    served = serve(config)
    rows = [
        completion_line("bad-temp", "A", temperature=-1),
        completion_line("private-hook", "B", webhook={"url": "http://10.0.0.1/"}),
    ]
    try:
        with served.client() as http:
            before = http.get("/metrics").text
            openai = _client(served)
            batch_id = start_batch(openai, rows, "/v1/completions")
            # No line runs (both are refused), so the batch completes without a worker.
            assert wait_status(openai, batch_id, {"completed", "failed"}, 10) == "completed"
            time.sleep(0.1)
            after = http.get("/metrics").text
    finally:
        stop(served)
    refused = 'paternoster_gateway_batch_lines_total{outcome="refused"}'
    assert _sample(before, refused) == 0 and _sample(after, refused) == 2
    assert _sample(after, 'paternoster_gateway_batch_lines_total{outcome="submitted"}') == 0
    assert _sample(after, 'paternoster_gateway_batches_total{status="completed"}') == 1
    assert _sample(after, "paternoster_webhook_in_flight") == 0  # the in-gateway deliverer's
