"""The native API against a live gateway and worker: submit, status, result, cancel, events."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
import redis

from producer import Keys
from tests.gateway.conftest import Served, parse_sse

GREEDY = {"max_tokens": 12, "temperature": 0, "ignore_eos": True}


def submit(client: httpx.Client, **body: object) -> str:
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    job_id: str = response.json()["job_id"]
    return job_id


def read_events(
    client: httpx.Client, job_id: str, limit: int | None = None, **kw: object
) -> list[dict[str, str]]:
    """The SSE events of a job (at most ``limit``; the connection is closed after them)."""
    events: list[dict[str, str]] = []
    with client.stream("GET", f"/v1/jobs/{job_id}/events", **kw) as response:  # type: ignore[arg-type]
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for event in parse_sse(response.iter_lines()):
            events.append(event)
            if len(events) == limit:
                break
    return events


def test_submit_status_result(gateway: Served) -> None:
    with gateway.client() as client:
        job_id = f"gw-{uuid.uuid4().hex[:8]}"
        first = client.post("/v1/jobs", json={"prompt": "Hello", "job_id": job_id, **GREEDY})
        assert first.status_code == 201 and first.json() == {"job_id": job_id, "created": True}
        again = client.post("/v1/jobs", json={"prompt": "Other", "job_id": job_id})
        assert again.status_code == 200 and again.json()["created"] is False
        result = client.get(f"/v1/jobs/{job_id}/result", params={"timeout_s": 30})
        assert result.status_code == 200, result.text
        body = result.json()
        assert body["state"] == "done" and len(body["token_ids"]) == 12
        assert body["usage"]["completion_tokens"] == 12 and body["timings"]["total_s"] > 0
        status = client.get(f"/v1/jobs/{job_id}").json()
        assert status["state"] == "done" and status["completion_tokens"] == 12


def test_messages_and_nested_sampling(gateway: Served) -> None:
    with gateway.client() as client:
        messages = [{"role": "user", "content": "Hi"}]
        job_id = submit(client, messages=messages, sampling={"max_tokens": 3, "n": 2})
        body = client.get(f"/v1/jobs/{job_id}/result").json()
        assert [c["index"] for c in body["choices"]] == [0, 1]


def test_unknown_job_is_404(gateway: Served) -> None:
    with gateway.client() as client:
        for method, path in [
            ("GET", "/v1/jobs/nope"),
            ("GET", "/v1/jobs/nope/result"),
            ("POST", "/v1/jobs/nope/cancel"),
            ("GET", "/v1/jobs/nope/events"),
            ("GET", "/v1/jobs/bad%20id"),
        ]:
            response = client.request(method, path)
            assert response.status_code == 404, (path, response.text)
            assert response.json()["error"]["code"] == "job_not_found"


def test_ids_extending_another_are_jobs_of_their_own(gateway: Served) -> None:
    """``order-77:events`` once named the key of ``order-77``'s events: submitted first, it left
    ``order-77`` running with nowhere to publish."""
    base = f"order-{uuid.uuid4().hex[:8]}"
    longer = [f"{base}:events", f"{base}:events:events", f"{base}:job"]
    with gateway.client() as client:
        for job_id in [*longer, base]:
            submit(client, prompt="Hi", max_tokens=2, job_id=job_id)
        for job_id in [base, *longer]:
            result = client.get(f"/v1/jobs/{job_id}/result", params={"timeout_s": 30})
            assert result.status_code == 200, (job_id, result.text)
            assert result.json()["job_id"] == job_id and result.json()["state"] == "done"
            events = read_events(client, job_id)
            assert (events[0]["event"], events[-1]["event"]) == ("started", "done")


def test_another_jobs_key_is_not_a_job(gateway: Served) -> None:
    with gateway.client() as client:
        job_id = submit(client, prompt="Hi", max_tokens=1)
        assert client.get(f"/v1/jobs/{job_id}/result").status_code == 200
        for path in (f"/v1/jobs/{job_id}:events", f"/v1/jobs/{job_id}:events/result"):
            response = client.get(path)
            assert response.status_code == 404, (path, response.text)
            assert response.json()["error"]["code"] == "job_not_found"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "exactly one of prompt"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "exactly one"),
        ({"prompt": "a", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "a", "no_such_field": 1}, "no_such_field"),
        ({"prompt": "a", "priority": 1000}, "priority"),
        ({"prompt": "a", "job_id": "has space"}, "id"),
        ({"messages": [{"role": "robot", "content": "b"}]}, "role"),
    ],
)
def test_invalid_job_is_422(gateway: Served, body: dict[str, object], says: str) -> None:
    with gateway.client() as client:
        response = client.post("/v1/jobs", json=body)
        assert response.status_code == 422, response.text
        assert says in response.json()["error"]["message"]


def test_not_json_is_422(gateway: Served) -> None:
    with gateway.client() as client:
        response = client.post("/v1/jobs", content=b"{not json", headers={"content-type": "x"})
        assert response.status_code == 422


def test_a_body_sets_the_cache_salt(idle_gateway: Served, redis_url: str, gw_prefix: str) -> None:
    keys = Keys(f"{gw_prefix}-idle")  # idle_gateway's prefix: the job stays queued
    raw = redis.Redis.from_url(redis_url, decode_responses=True)
    with idle_gateway.client() as client:
        job_id = submit(client, prompt="Hello", cache_salt="team-1")
        (fields,) = [f for _, f in raw.xrange(keys.jobs) if f["id"] == job_id]
        assert json.loads(fields["payload"])["cache_salt"] == "team-1"
        bad = client.post("/v1/jobs", json={"prompt": "Hello", "cache_salt": ""})
        assert bad.status_code == 422 and "cache_salt" in bad.json()["error"]["message"]
        client.post(f"/v1/jobs/{job_id}/cancel")
    raw.close()


def test_result_timeout_then_cancel(idle_gateway: Served) -> None:
    with idle_gateway.client() as client:
        job_id = submit(client, prompt="Hello")
        waited = client.get(f"/v1/jobs/{job_id}/result", params={"timeout_s": 0.2})
        assert waited.status_code == 504
        assert client.get(f"/v1/jobs/{job_id}").json()["state"] == "queued"
        cancel = client.post(f"/v1/jobs/{job_id}/cancel")
        assert cancel.json() == {"job_id": job_id, "outcome": "cancelled"}
        ended = client.get(f"/v1/jobs/{job_id}/result")
        assert ended.status_code == 409
        assert ended.json()["error"]["state"] == "cancelled"


def test_events_contiguous_and_resumable(gateway: Served) -> None:
    with gateway.client() as client:
        job_id = submit(client, prompt="Once upon a time", **GREEDY)
        whole = read_events(client, job_id)
        assert whole[0]["event"] == "started" and whole[-1]["event"] == "done"
        tokens = [json.loads(e["data"]) for e in whole if e["event"] == "token"]
        assert [t["index"] for t in tokens] == list(range(12))  # one token per event, in order
        assert all(json.loads(e["data"])["type"] == e["event"] for e in whole)
        ids = [e["id"] for e in whole]
        assert len(set(ids)) == len(ids)

        head = read_events(client, job_id, limit=2)
        rest = read_events(client, job_id, headers={"Last-Event-ID": head[-1]["id"]})
        assert [e["id"] for e in head + rest] == ids
        tail = read_events(client, job_id, params={"from_event": ids[-3]})
        assert [e["id"] for e in tail] == ids[-2:]


def test_events_bad_resume_id_is_422(gateway: Served) -> None:
    with gateway.client() as client:
        job_id = submit(client, prompt="Hi", max_tokens=1)
        for bad in ("latest", "1-2-3", "9" * 20):
            response = client.get(f"/v1/jobs/{job_id}/events", params={"from_event": bad})
            assert response.status_code == 422, bad
            assert "event id" in response.json()["error"]["message"]
