"""Fuzzed job entries against a live worker through a real Redis: every one ends with one
terminal event (or, with no usable id, in the dead-letter stream), and the worker and all its
threads keep serving."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producer import Producer
from producer.keys import is_valid_job_id
from producer.protocol import is_terminal
from tests.service.conftest import running_worker, tiny_engine
from tests.service.streams import follow_raw_job
from worker.engine.llm_engine import LLMEngine
from worker.service.worker import JobWorker

JSON = st.recursive(
    # NaN and +-Infinity included: json.dumps writes them, and Python's json.loads reads them.
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
# Near-valid specs are the interesting ones: right keys, wrong or extreme values.
SPEC = st.fixed_dictionaries(
    {},
    optional={
        "schema_version": st.integers(-1, 3),
        "prompt": st.text(max_size=40),
        "prompt_token_ids": st.lists(st.integers(-5, 70_000), max_size=8),
        "messages": st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "bot"]), "content": st.text(max_size=10)}
            ),
            max_size=2,
        ),
        "sampling": st.dictionaries(
            st.sampled_from(
                [
                    *("max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p"),
                    *("n", "stop", "seed", "stop_token_ids", "logprobs", "ignore_eos"),
                ]
            ),
            JSON,
            max_size=3,
        ),
        "priority": JSON,
        "tenant": JSON,
        "deadline": JSON,
        "metadata": JSON,
    },
)
PAYLOAD = st.one_of(
    SPEC.map(json.dumps),
    JSON.map(json.dumps),
    st.text(max_size=30),
    st.binary(max_size=30).map(lambda b: b.decode("latin-1")),
)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> LLMEngine:
    return tiny_engine(tiny_model_dir, max_model_len=64)


@pytest.mark.slow
def test_fuzzed_payloads_each_end_and_the_worker_keeps_serving(
    engine: LLMEngine, redis_url: str, prefix: str
) -> None:
    with running_worker(engine, redis_url, prefix) as _, Producer(redis_url, prefix=prefix) as p:
        count = 0

        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
        @given(payload=PAYLOAD)
        def one(payload: str) -> None:
            nonlocal count
            count += 1
            job_id = f"fuzz-{count}"
            fields: dict[str, Any] = {"id": job_id, "payload": _with_id(payload, job_id)}
            p.redis.xadd(p.keys.jobs, fields)
            events = follow_raw_job(p, job_id)
            assert sum(is_terminal(e) for e in events) == 1 and is_terminal(events[-1])

        one()
        good = p.submit("still serving", max_tokens=3, temperature=0.0, ignore_eos=True)
        assert len(good.result(timeout_s=30).token_ids) == 3


def _with_id(payload: str, job_id: str) -> str:
    """Valid JSON objects get the entry's id, so they are judged on the rest of their fields."""
    try:
        raw = json.loads(payload)
    except ValueError:
        return payload
    if isinstance(raw, dict):
        raw["id"] = job_id
        return json.dumps(raw)
    return payload


# Whole entries as bytes, the way any client can XADD them: the id valid, garbage or missing,
# the payload a near-valid spec, JSON, or bytes that are not UTF-8, and fields nobody reads.
BYTES = st.binary(max_size=24)
ENTRY = st.fixed_dictionaries(
    {
        "id": st.sampled_from(["valid", "garbage", "missing"]),
        "payload": st.one_of(
            SPEC.map(lambda d: json.dumps(d).encode()),
            SPEC.map(lambda d: json.dumps(d).encode()[:-1] + b"\xff\xfe}"),
            JSON.map(lambda v: json.dumps(v).encode()),
            BYTES,
            st.none(),
        ),
        "extra": st.dictionaries(BYTES.filter(lambda b: b not in (b"id", b"payload")), BYTES),
    }
)


@pytest.mark.slow
def test_fuzzed_entry_bytes_each_end_or_dead_letter_and_every_thread_lives(
    engine: LLMEngine, redis_url: str, prefix: str
) -> None:
    raw = redis.Redis.from_url(redis_url)
    with (
        running_worker(engine, redis_url, prefix) as worker,
        Producer(redis_url, prefix=prefix) as p,
    ):
        count = 0

        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
        @given(entry=ENTRY, garbage=BYTES)
        def one(entry: dict[str, Any], garbage: bytes) -> None:
            nonlocal count
            count += 1
            job_id = f"fuzz-b-{count}".encode()
            fields: dict[bytes, bytes] = dict(entry["extra"])
            if entry["id"] == "valid":
                fields[b"id"] = job_id
            elif entry["id"] == "garbage":
                fields[b"id"] = garbage
            if entry["payload"] is not None:
                fields[b"payload"] = _bytes_with_id(entry["payload"], job_id)
            if not fields:
                fields[b"payload"] = b""
            entry_id = raw.xadd(p.keys.jobs, fields)
            name = fields.get(b"id", b"").decode("utf-8", "surrogateescape")
            if is_valid_job_id(name):
                events = follow_raw_job(p, name)
                assert sum(is_terminal(e) for e in events) == 1 and is_terminal(events[-1])
            else:
                _wait_dead_lettered(raw, p, entry_id)
            _assert_threads_live(worker)

        one()
        good = p.submit("still serving", max_tokens=3, temperature=0.0, ignore_eos=True)
        assert len(good.result(timeout_s=30).token_ids) == 3
        assert raw.xpending(p.keys.jobs, p.keys.group)["pending"] == 0
        _assert_threads_live(worker)


def _bytes_with_id(payload: bytes, job_id: bytes) -> bytes:
    try:
        return _with_id(payload.decode(), job_id.decode()).encode()
    except UnicodeDecodeError:
        return payload


def _wait_dead_lettered(raw: redis.Redis, p: Producer, entry_id: bytes) -> None:
    deadline = time.monotonic() + 30
    while True:
        entries = raw.xrange(p.keys.dead_letter)
        if any(fields.get(b"entry_id") == entry_id for _, fields in entries):
            return
        assert time.monotonic() < deadline, f"{entry_id!r} neither ended nor dead-lettered"
        time.sleep(0.01)


def _assert_threads_live(worker: JobWorker) -> None:
    for thread in (worker.intake, worker.cancels, worker.publisher, worker.lease):
        assert thread.is_alive(), thread.name
