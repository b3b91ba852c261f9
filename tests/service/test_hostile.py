"""Hostile input through Redis: each bad job gets a clear error on its own stream, nothing is
lost, and the worker (every thread of it) keeps serving."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis

from producer import JobFailed, Producer
from producer.protocol import ErrorEvent, is_terminal
from producer.requests import build_spec
from tests.service.conftest import running_worker, tiny_engine
from tests.service.streams import follow_raw_job
from tests.service.test_worker import GREEDY, assert_serves_on
from worker.engine.llm_engine import LLMEngine
from worker.service.metrics import WorkerMetrics
from worker.service.recovery import Reclaimer


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> LLMEngine:
    return tiny_engine(tiny_model_dir, max_model_len=96)


@pytest.mark.parametrize("bad", [[-1], [99_999_999]])
def test_a_stop_token_outside_the_vocabulary_fails_the_job_not_the_worker(
    engine: LLMEngine, redis_url: str, prefix: str, bad: list[int]
) -> None:
    with running_worker(engine, redis_url, prefix), Producer(redis_url, prefix=prefix) as p:
        handle = p.submit("hi", max_tokens=4, stop_token_ids=bad)
        with pytest.raises(JobFailed) as info:
            handle.result(timeout_s=30)
        assert info.value.code == "invalid_request" and "stop_token_ids" in str(info.value)
        assert_serves_on(p)


def test_a_step_failure_fails_its_jobs_and_the_worker_serves_on(
    engine: LLMEngine, redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the engine cannot pin on one request (here its whole step raises) ends the jobs
    in it with an error event; the process lives."""
    real = engine.step
    calls = {"n": 0}

    def fails_once() -> Any:
        calls["n"] += 1
        if calls["n"] == 1 and engine.has_unfinished():
            raise RuntimeError("scheduler bug")
        return real()

    metrics = WorkerMetrics("hostile")
    with (
        running_worker(engine, redis_url, prefix, metrics=metrics),
        Producer(redis_url, prefix=prefix) as p,
    ):
        monkeypatch.setattr(engine, "step", fails_once)
        with pytest.raises(JobFailed) as info:
            p.submit("doomed", max_tokens=4, **GREEDY).result(timeout_s=30)
        assert info.value.code == "internal" and "scheduler bug" in str(info.value)
        assert_serves_on(p)
    assert not engine.has_unfinished()
    # The metrics count it as an error: its outcome is set before the job is forgotten.
    assert 'outcome="error"' in metrics.render().decode()


def test_invalid_utf8_in_an_entry_is_malformed_json_and_intake_lives(
    engine: LLMEngine, redis_url: str, prefix: str
) -> None:
    metrics = WorkerMetrics("hostile")
    raw = redis.Redis.from_url(redis_url)  # bytes in, bytes out: what redis-cli -x sends
    with (
        running_worker(engine, redis_url, prefix, metrics=metrics) as worker,
        Producer(redis_url, prefix=prefix) as p,
    ):
        raw.xadd(p.keys.jobs, {b"id": b"u1", b"payload": b'{"id":"u1","prompt":"\xff"}'})
        events = follow_raw_job(p, "u1")
        assert isinstance(events[-1], ErrorEvent) and events[-1].code == "malformed_json"
        assert "UTF-8" in events[-1].message
        assert_serves_on(p)
        assert worker.intake.is_alive() and worker.cancels.is_alive()
        assert metrics.health()[0] == 200


def test_an_entry_with_an_unusable_id_moves_whole_to_the_dead_letters(
    engine: LLMEngine, redis_url: str, prefix: str
) -> None:
    raw = redis.Redis.from_url(redis_url)
    with running_worker(engine, redis_url, prefix), Producer(redis_url, prefix=prefix) as p:
        raw.xadd(p.keys.jobs, {b"id": b"bad id \xff", b"payload": b"{}", b"extra": b"kept"})
        raw.xadd(p.keys.jobs, {b"payload": b"{}"})  # no id at all
        deadline = time.monotonic() + 30
        while raw.xlen(p.keys.dead_letter) < 2:
            assert time.monotonic() < deadline, "not dead-lettered"
            time.sleep(0.02)
        entries = [fields for _, fields in raw.xrange(p.keys.dead_letter)]
        assert entries[0][b"id"] == b"bad id \xff" and entries[0][b"extra"] == b"kept"
        assert all(e[b"reason"] == b"invalid_id" for e in entries)
        assert_serves_on(p)


def test_health_fails_when_a_helper_thread_has_died(
    engine: LLMEngine, redis_url: str, prefix: str
) -> None:
    metrics = WorkerMetrics("hostile")
    with running_worker(engine, redis_url, prefix, metrics=metrics) as worker:
        deadline = time.monotonic() + 10
        while metrics.health()[0] != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        worker.cancels.stopping.set()  # as if it had died
        worker.cancels.join(timeout=10)
        status, body = metrics.health()
        assert status == 503 and body["dead_threads"] == ["paternoster-cancels"]


def test_metrics_listen_on_loopback_unless_asked() -> None:
    server = WorkerMetrics("hostile").serve(port=0)
    try:
        assert server.server_address[0] == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
            assert r.status == 200
    finally:
        server.close()
    with pytest.raises(urllib.error.URLError):  # nothing on any other address of this host
        urllib.request.urlopen(f"http://127.0.0.2:{server.port}/metrics", timeout=2)


def test_tenants_do_not_share_cached_prompts_by_default_even_naming_a_salt(
    tiny_model_dir: Path, redis_url: str, prefix: str
) -> None:
    prompt = list(range(100, 140))  # 10 full blocks of 4
    engine = tiny_engine(tiny_model_dir)
    with running_worker(engine, redis_url, prefix), Producer(redis_url, prefix=prefix) as p:
        a = p.submit(prompt_token_ids=prompt, tenant="a", max_tokens=2, **GREEDY)
        assert a.result(timeout_s=30).usage is not None
        same = p.submit(prompt_token_ids=prompt, tenant="a", max_tokens=2, **GREEDY)
        hit = same.result(timeout_s=30).usage
        assert hit is not None and hit.cached_prompt_tokens > 0  # a tenant shares with itself
        for salt in (None, "a", "1:a:", "tenant:a"):  # none of them reaches a's blocks
            spec = build_spec(prompt_token_ids=prompt, tenant="b", max_tokens=2, **GREEDY)
            if salt is not None:
                spec = spec.model_copy(update={"cache_salt": salt})
            usage = p.submit_spec(spec).result(timeout_s=30).usage
            assert usage is not None and usage.cached_prompt_tokens == 0, salt


def test_the_dead_letter_message_counts_the_deliveries_that_happened(
    client: redis.Redis, prefix: str
) -> None:
    """The limit is the worker's setting; the message says how many workers ran the job."""
    p = Producer(client=client, prefix=prefix)
    job = p.keys.job("poison")
    client.hset(job, mapping={"state": "running", "worker": "old", "deliveries": 3})
    client.xgroup_create(p.keys.jobs, p.keys.group, id="0", mkstream=True)
    entry = client.xadd(p.keys.jobs, {"id": "poison", "payload": "{}"})
    reclaimer = Reclaimer(client, p.keys, "new", max_deliveries=1, ttl_s=60)
    outcome, _ = reclaimer._reclaim(p.keys.jobs, entry, {"id": "poison"}, "old")
    assert outcome == "dead_letter"
    (event,) = [e for e in p.stream("poison", timeout_s=5) if is_terminal(e)]
    assert isinstance(event, ErrorEvent) and "after 3 deliveries" in event.message
    data = json.loads(client.xrange(p.keys.events("poison"))[0][1]["data"])
    assert data["code"] == "dead_letter" and "after 3 deliveries" in data["message"]
