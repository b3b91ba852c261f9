"""WorkerMetrics against docs/metrics.md, against what it was fed, and over real HTTP.

No Redis, no model: each test builds its own registry and runs in milliseconds.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from worker.service.metrics import WAITING_REASONS, WorkerMetrics
from worker.service.metrics_server import MetricsServer

ROOT = Path(__file__).resolve().parents[2]
DOC_ROW = re.compile(r"^\| `(paternoster_\w+)` \| (counter|gauge|histogram|info) \|")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def documented() -> dict[str, str]:
    """Metric name -> type, from the table in docs/metrics.md."""
    rows = (DOC_ROW.match(line) for line in (ROOT / "docs/metrics.md").read_text().splitlines())
    return {m.group(1): m.group(2) for m in rows if m}


def exported(metrics: WorkerMetrics) -> set[str]:
    """The metric names in render(): histogram suffixes and the _created timestamps folded."""
    histograms = {n for n, t in documented().items() if t == "histogram"}
    names = set()
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            name = sample.name
            if name.endswith("_created"):
                continue
            for suffix in HISTOGRAM_SUFFIXES:
                if name.endswith(suffix) and name.removesuffix(suffix) in histograms:
                    name = name.removesuffix(suffix)
            names.add(name)
    return names


def samples(metrics: WorkerMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """(sample name, labels) -> value, parsed back from the text format."""
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(metrics: WorkerMetrics, name: str, **labels: str) -> float:
    return samples(metrics)[(name, frozenset(labels.items()))]


def feed_everything(m: WorkerMetrics) -> None:
    """Each API method once, with the values the value tests check."""
    m.step(
        num_running=5,
        num_waiting=2,
        num_batched_tokens=300,
        num_generated_tokens=5,
        kv_blocks_used=30,
        kv_blocks_total=120,
        step_s=0.04,
    )
    m.jobs_held(band="interactive", waiting=1, running=4)
    m.queue_depth(band="batch", depth=17)
    m.job_started(band="default", queued_s=0.2)
    m.first_token(band="default", ttft_s=0.3)
    m.job_finished(
        band="default",
        outcome="done",
        finish_reason="stop",
        e2e_s=1.5,
        tpot_s=0.02,
        completion_tokens=61,
    )
    m.rejected(code="prompt_too_long")
    m.preempted(reason="kv_cache_full")
    m.waiting_reason(reason="no_batch_slot", count=2)
    m.prefix_cache(queried_tokens=512, hit_tokens=496)
    m.publish(round_trips=1, commands=9, retries=0)
    m.mark_alive()


def test_the_doc_table_and_the_export_name_the_same_metrics() -> None:
    docs = documented()
    assert len(docs) >= 25 and all(n.startswith("paternoster_") for n in docs)
    m = WorkerMetrics("host-1")
    feed_everything(m)
    got = exported(m)
    assert not docs.keys() - got, f"documented, not exported: {sorted(docs.keys() - got)}"
    ours = {n for n in got if n.startswith("paternoster_")}
    assert not ours - docs.keys(), f"exported, not documented: {sorted(ours - docs.keys())}"


def test_doc_types_match_the_registry() -> None:
    m = WorkerMetrics("host-1")
    kinds = {f.name: f.type for f in m.registry.collect()}
    for name, kind in documented().items():
        suffix = {"counter": "_total", "info": "_info"}.get(kind, "")
        assert kinds[name.removesuffix(suffix)] == kind, name


def test_counters_add_gauges_set_histograms_count_and_sum() -> None:
    m = WorkerMetrics("host-1")
    feed_everything(m)
    feed_everything(m)
    assert value(m, "paternoster_worker_info", worker="host-1") == 1
    assert value(m, "paternoster_steps_total") == 2
    assert value(m, "paternoster_generated_tokens_total") == 10
    assert value(m, "paternoster_running_sequences") == 5  # set, not added
    assert value(m, "paternoster_kv_cache_usage_ratio") == pytest.approx(0.25)
    assert value(m, "paternoster_step_duration_seconds_count") == 2
    assert value(m, "paternoster_step_duration_seconds_sum") == pytest.approx(0.08)
    assert value(m, "paternoster_step_tokens_bucket", le="256.0") == 0
    assert value(m, "paternoster_step_tokens_bucket", le="384.0") == 2
    assert value(m, "paternoster_held_jobs", band="interactive", state="running") == 4
    assert value(m, "paternoster_held_jobs", band="batch", state="running") == 0  # pre-created
    assert value(m, "paternoster_queued_jobs", band="batch") == 17
    assert value(m, "paternoster_time_to_first_token_seconds_sum", band="default") == 0.6
    assert value(m, "paternoster_e2e_latency_seconds_count", band="default") == 2
    assert value(m, "paternoster_completion_tokens_sum", band="default") == 122
    finished = {"band": "default", "outcome": "done", "finish_reason": "stop"}
    assert value(m, "paternoster_jobs_finished_total", **finished) == 2
    assert value(m, "paternoster_jobs_rejected_total", code="prompt_too_long") == 2
    assert value(m, "paternoster_preemptions_total", reason="kv_cache_full") == 2
    assert value(m, "paternoster_preemptions_total", reason="priority") == 0
    assert value(m, "paternoster_prefix_cache_hit_tokens_total") == 992
    assert value(m, "paternoster_publisher_commands_total") == 18


def test_only_done_jobs_enter_the_latency_histograms() -> None:
    m = WorkerMetrics("w")
    m.job_finished(
        band="batch", outcome="cancelled", finish_reason=None, e2e_s=9.0, tpot_s=0.5,
        completion_tokens=3,
    )  # fmt: skip
    m.job_finished(
        band="batch", outcome="done", finish_reason="length", e2e_s=2.0, tpot_s=None,
        completion_tokens=1,
    )  # fmt: skip
    cancelled = {"band": "batch", "outcome": "cancelled", "finish_reason": ""}
    assert value(m, "paternoster_jobs_finished_total", **cancelled) == 1
    assert value(m, "paternoster_completion_tokens_count", band="batch") == 2
    assert value(m, "paternoster_e2e_latency_seconds_sum", band="batch") == 2.0
    assert value(m, "paternoster_time_per_output_token_seconds_count", band="batch") == 0


def test_a_waiting_reason_not_reported_for_a_step_reads_zero() -> None:
    m = WorkerMetrics("w")
    step = {
        "num_running": 1, "num_waiting": 3, "num_batched_tokens": 1, "num_generated_tokens": 1,
        "kv_blocks_used": 1, "kv_blocks_total": 0, "step_s": 0.01,
    }  # fmt: skip
    m.waiting_reason(reason="kv_cache_full", count=3)
    m.waiting_reason(reason="some_new_reason", count=1)  # not in the known set: zeroed all the same
    m.step(**step)  # type: ignore[arg-type]
    assert value(m, "paternoster_waiting_jobs", reason="kv_cache_full") == 3
    assert value(m, "paternoster_kv_cache_usage_ratio") == 0  # no division by 0 blocks
    m.step(**step)  # type: ignore[arg-type]
    for reason in (*WAITING_REASONS, "some_new_reason"):
        assert value(m, "paternoster_waiting_jobs", reason=reason) == 0


@pytest.fixture
def served() -> Iterator[tuple[WorkerMetrics, MetricsServer]]:
    m = WorkerMetrics("http-1", stale_after_s=0.2)
    server = m.serve(port=0, host="127.0.0.1")
    yield m, server
    server.close()


def get(server: MetricsServer, path: str) -> tuple[int, str, bytes]:
    url = f"http://127.0.0.1:{server.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


def test_serve_answers_metrics_and_health_over_http(
    served: tuple[WorkerMetrics, MetricsServer],
) -> None:
    m, server = served
    assert server.port > 0
    status, _, body = get(server, "/health")
    assert (status, json.loads(body)) == (503, {"status": "starting", "last_step_age_s": None})
    m.mark_alive()
    status, kind, body = get(server, "/health")
    assert (status, kind) == (200, "application/json")
    health = json.loads(body)
    assert health["status"] == "ok" and 0 <= health["last_step_age_s"] < 0.2
    m.publish(round_trips=3, commands=30, retries=1)
    status, kind, body = get(server, "/metrics")
    assert status == 200 and kind.startswith("text/plain")
    assert b"paternoster_publisher_commands_total 30.0" in body
    assert get(server, "/nope")[0] == 404


def test_health_turns_503_when_the_loop_goes_quiet(
    served: tuple[WorkerMetrics, MetricsServer],
) -> None:
    m, server = served
    m.mark_alive()
    assert get(server, "/health")[0] == 200
    time.sleep(0.25)  # past stale_after_s=0.2
    status, _, body = get(server, "/health")
    assert status == 503 and json.loads(body)["status"] == "stale"
    assert json.loads(body)["last_step_age_s"] >= 0.2
    m.step(
        num_running=0, num_waiting=0, num_batched_tokens=0, num_generated_tokens=0,
        kv_blocks_used=0, kv_blocks_total=8, step_s=0.001,
    )  # fmt: skip
    assert get(server, "/health")[0] == 200  # a step is a sign of life too


def test_close_frees_the_port_and_is_idempotent() -> None:
    m = WorkerMetrics("w")
    server = m.serve(port=0, host="127.0.0.1")
    port = server.port
    server.close()
    server.close()
    again = m.serve(port=port, host="127.0.0.1")  # the same port binds again at once
    assert again.port == port
    again.close()


def test_registries_are_independent() -> None:
    a, b = WorkerMetrics("a"), WorkerMetrics("b")
    a.rejected(code="internal")
    assert ("paternoster_jobs_rejected_total", frozenset({("code", "internal")})) not in samples(b)
