"""Priority aliases, admission limits and wait reasons through the gateway, on the idle gateway
(no worker: jobs stay queued). Each test limits a tenant of its own, so the limits touch no
other test's jobs."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from producer import Keys
from tests.gateway.conftest import Served


@pytest.fixture
def full_tenant(redis_url: str, gw_prefix: str) -> Iterator[str]:
    """A tenant whose jobs limit is 0 on the idle gateway's prefix: every submit is refused."""
    tenant = f"full-{uuid.uuid4().hex[:8]}"
    keys = Keys(f"{gw_prefix}-idle")
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.hset(keys.limits, f"tenant:{tenant}:jobs", 0)
    yield tenant
    client.hdel(keys.limits, f"tenant:{tenant}:jobs")
    client.close()


def assert_429(response: object, tenant: str) -> dict[str, object]:
    assert getattr(response, "status_code", None) == 429, getattr(response, "text", "")
    headers = getattr(response, "headers", {})
    assert headers["Retry-After"] == "1"  # whole seconds, at least 1
    error: dict[str, object] = response.json()["error"]  # type: ignore[attr-defined]
    assert (error["type"], error["code"], error["param"]) == (
        "rate_limit_error", "rate_limit_exceeded", None
    )  # fmt: skip
    assert (error["scope"], error["kind"], error["current"], error["limit"]) == (
        f"tenant:{tenant}", "jobs", 0, 0
    )  # fmt: skip
    assert f"tenant:{tenant}" in str(error["message"])
    return error


def test_native_submit_refused_is_429_with_retry_after(
    idle_gateway: Served, full_tenant: str
) -> None:
    job_id = f"gw-{uuid.uuid4().hex[:8]}"
    with idle_gateway.client() as client:
        response = client.post(
            "/v1/jobs", json={"prompt": "x", "tenant": full_tenant, "job_id": job_id}
        )
        assert_429(response, full_tenant)
        assert client.get(f"/v1/jobs/{job_id}").status_code == 404  # nothing was enqueued


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "x"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ],
)
def test_openai_submit_refused_is_429_with_retry_after(
    idle_gateway: Served, full_tenant: str, path: str, body: dict[str, object]
) -> None:
    with idle_gateway.client() as client:
        response = client.post(path, json={"model": "m", "user": full_tenant, **body})
        assert_429(response, full_tenant)
        streamed = client.post(path, json={"user": full_tenant, "stream": True, **body})
        assert_429(streamed, full_tenant)  # refused before any stream starts


def test_priority_alias_and_wait_reason(idle_gateway: Served) -> None:
    with idle_gateway.client() as client:
        response = client.post("/v1/jobs", json={"prompt": "x", "priority": "batch"})
        assert response.status_code == 201, response.text
        job_id = response.json()["job_id"]
        status = client.get(f"/v1/jobs/{job_id}").json()
        assert (status["priority"], status["band"], status["state"]) == (10, "batch", "queued")
        assert status["wait_reason"] == "no_worker" and isinstance(status["position"], int)
        client.post(f"/v1/jobs/{job_id}/cancel")
        bad = client.post("/v1/jobs", json={"prompt": "x", "priority": "urgent"})
        assert bad.status_code == 422 and "unknown priority 'urgent'" in bad.text
