"""The worker's JSON logs: every job event names its job, tenant and worker; the level filters.

One short real run on the tiny model covers each job event the worker logs: a job that runs
to the end, two rejected entries, a cancelled job, one stopped by its deadline and one that
expired before it started. The lines are captured as the worker writes them (JSON on a stream).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from producer import JobCancelled, JobExpired, Producer
from producer.protocol import TokenEvent
from tests.service.conftest import running_worker, tiny_engine
from tests.service.test_priority import slowed
from worker.cli import build_parser
from worker.service.logs import configure_logging

GREEDY = {"temperature": 0.0, "ignore_eos": True}
JOB_EVENTS = {
    "job_started",
    "job_finished",
    "job_rejected",
    "job_skipped",
    "job_cancel_requested",
    "job_deadline",
    "job_first_token",
}


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    """A StringIO the JSON log lines go to; structlog's previous configuration after."""
    saved = structlog.get_config()
    stream = io.StringIO()
    try:
        yield stream
    finally:
        structlog.configure(**saved)


def records(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def test_every_job_event_names_job_tenant_and_worker(
    tiny_model_dir: Path, redis_url: str, prefix: str, log_stream: io.StringIO
) -> None:
    configure_logging("info", stream=log_stream)
    # 10 ms a step: a 400-token job runs 4 s, far past a 0.5 s deadline on any machine.
    engine = slowed(tiny_engine(tiny_model_dir, seqs=1), 0.01)
    with (
        running_worker(engine, redis_url, prefix, name="log-worker") as _,
        Producer(redis_url, prefix=prefix) as p,
    ):
        p.submit("fine", job_id="ok", tenant="acme", max_tokens=3, **GREEDY).result(timeout_s=30)
        p.redis.xadd(p.keys.jobs, {"id": "bad", "payload": "{not json"})
        p.redis.xadd(p.keys.jobs, {"id": "has spaces", "payload": "{}"})
        long = p.submit("long", job_id="long", tenant="beta", max_tokens=400, **GREEDY)
        for event in long.stream(timeout_s=30):
            if isinstance(event, TokenEvent):
                break
        long.cancel()
        with pytest.raises(JobCancelled):
            long.result(timeout_s=30)
        late = p.submit("late", job_id="late", tenant="gamma", max_tokens=400, deadline_s=0.5,
                        **GREEDY)  # fmt: skip
        assert late.result(timeout_s=30).finish_reason == "deadline"
        gone = p.submit("gone", job_id="gone", tenant="delta", deadline_s=-1.0, **GREEDY)
        with pytest.raises(JobExpired):
            gone.result(timeout_s=30)
    lines = records(log_stream)
    job_lines = [r for r in lines if r["event"] in JOB_EVENTS]
    assert {r["event"] for r in job_lines} == JOB_EVENTS
    for record in job_lines:
        assert {"job_id", "tenant", "worker", "level", "timestamp"} <= record.keys(), record
        assert record["worker"] == "log-worker"
    by_job: dict[str, list[tuple[str, str | None]]] = {}
    for r in job_lines:
        by_job.setdefault(r["job_id"], []).append((r["event"], r["tenant"]))
    ok = [("job_started", "acme"), ("job_first_token", "acme"), ("job_finished", "acme")]
    assert by_job["ok"] == ok
    assert by_job["long"] == [
        ("job_started", "beta"),
        ("job_first_token", "beta"),
        ("job_cancel_requested", "beta"),
        ("job_finished", "beta"),
    ]
    assert by_job["late"] == [
        ("job_started", "gamma"),
        ("job_first_token", "gamma"),
        ("job_deadline", "gamma"),
        ("job_finished", "gamma"),
    ]
    assert by_job["gone"] == [("job_skipped", "delta")]
    # Rejected before its spec was read: the tenant is unknown, and says so (null).
    assert by_job["bad"] == [("job_rejected", None)]
    assert by_job["has spaces"] == [("job_rejected", None)]
    # The worker's own lifecycle lines name it too (bound once, not passed at each call).
    names = {r["event"]: r.get("worker") for r in lines}
    assert names["worker_started"] == names["worker_stopped"] == "log-worker"


def test_log_level_drops_lower_events_even_for_loggers_made_before(
    log_stream: io.StringIO,
) -> None:
    # A worker binds its logger when it is built; a level set later must still apply to it.
    bound = structlog.get_logger("paternoster.worker", worker="w")
    configure_logging("warning", stream=log_stream)
    bound.info("job_started", job_id="a", tenant="t")
    bound.warning("job_rejected", job_id="b", tenant=None)
    (record,) = records(log_stream)
    assert record["event"] == "job_rejected" and record["level"] == "warning"
    assert record["worker"] == "w"
    configure_logging("debug", stream=log_stream)
    bound.debug("detail", job_id="c", tenant="t")
    assert records(log_stream)[-1]["event"] == "detail"


def test_exceptions_log_their_traceback(log_stream: io.StringIO) -> None:
    configure_logging("info", stream=log_stream)
    try:
        raise RuntimeError("tokenizer broke")
    except RuntimeError:
        structlog.get_logger("t", worker="w").exception("job_parse_failed", job_id="x")
    (record,) = records(log_stream)
    assert "RuntimeError: tokenizer broke" in record["exception"]


def test_worker_takes_a_log_level() -> None:
    args = build_parser().parse_args(["worker", "--log-level", "warning"])
    assert args.log_level == "warning"
    assert build_parser().parse_args(["worker"]).log_level == "info"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--log-level", "loud"])
