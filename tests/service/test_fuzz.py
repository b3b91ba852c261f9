"""Fuzzed job payloads against a live worker: every one ends with one terminal event, and the
worker keeps serving."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producer import Producer
from producer.protocol import is_terminal
from tests.service.conftest import running_worker, tiny_engine
from worker.engine.llm_engine import LLMEngine

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
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
            st.sampled_from(["max_tokens", "temperature", "top_p", "top_k", "n", "stop", "seed"]),
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
            events = _follow(p, job_id)
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


def _follow(p: Producer, job_id: str) -> list[Any]:
    deadline = time.monotonic() + 60
    while not p.redis.exists(p.keys.events(job_id)):  # a bare XADD: no hash until claimed
        assert time.monotonic() < deadline, f"{job_id} never claimed"
        time.sleep(0.01)
    return list(p.stream(job_id, timeout_s=60))
