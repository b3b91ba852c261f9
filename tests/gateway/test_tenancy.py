"""Tenant-scoped job ids behind auth: each tenant its own ``order-77``, and no answer that tells
a tenant another's id exists. Without auth, ids are the job plane's as they are."""

from __future__ import annotations

import re
import uuid

import httpx
import openai
import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import GatewayConfig
from producer.keys import JOB_ID_PATTERN, MAX_JOB_ID_CHARS, Keys
from tests.gateway.conftest import TOKENS, Served, parse_sse

ID_CHAR = "[A-Za-z0-9._:@-]"
TENANT_OF = {"tok-a": "tenant-a", "tok-b": "tenant-b"}


def new_id(name: str = "order") -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def assert_no_other_id(text: str, job_id: str) -> None:
    """``job_id`` appears in ``text`` only whole: never inside a longer (internal) id."""
    assert not re.search(rf"{ID_CHAR}{re.escape(job_id)}|{re.escape(job_id)}{ID_CHAR}", text), text


def events_of(client: httpx.Client, job_id: str) -> list[dict[str, str]]:
    with client.stream("GET", f"/v1/jobs/{job_id}/events") as response:
        assert response.status_code == 200, response.read()
        return list(parse_sse(response.iter_lines()))


def test_each_tenant_has_its_own_ids(auth_gateway: Served) -> None:
    tokens = {"tok-a": 2, "tok-b": 3}  # each tenant's jobs generate their own token count
    a_first, b_first = new_id(), new_id()
    with auth_gateway.client("tok-a") as a, auth_gateway.client("tok-b") as b:
        clients = {"tok-a": a, "tok-b": b}
        for job_id, order in ((a_first, ("tok-a", "tok-b")), (b_first, ("tok-b", "tok-a"))):
            for token in order:  # the second to take an id gets a job of its own, not 200
                body = {"prompt": "Hi", "max_tokens": tokens[token], "ignore_eos": True}
                created = clients[token].post("/v1/jobs", json={**body, "job_id": job_id})
                assert created.status_code == 201, (token, created.text)
                assert created.json() == {"job_id": job_id, "created": True}
            again = clients[order[0]].post("/v1/jobs", json={"prompt": "x", "job_id": job_id})
            assert again.status_code == 200 and again.json()["created"] is False
        for job_id in (a_first, b_first):
            for token, client in clients.items():
                result = client.get(f"/v1/jobs/{job_id}/result")
                assert result.status_code == 200, result.text
                assert result.json()["job_id"] == job_id
                assert result.json()["usage"]["completion_tokens"] == tokens[token]
                status = client.get(f"/v1/jobs/{job_id}").json()
                assert (status["job_id"], status["tenant"]) == (job_id, TENANT_OF[token])
                assert events_of(client, job_id)[-1]["event"] == "done"
                cancel = client.post(f"/v1/jobs/{job_id}/cancel")
                assert cancel.json() == {"job_id": job_id, "outcome": "done"}
                recent = client.get("/v1/status", params={"recent": 100}).json()["recent"]
                assert [r["job_id"] for r in recent].count(job_id) == 1
                assert {r["tenant"] for r in recent} == {TENANT_OF[token]}
                for response in (result, cancel):
                    assert_no_other_id(response.text, job_id)


def test_another_tenants_job_answers_as_no_job(auth_gateway: Served) -> None:
    theirs, never = new_id(), new_id("never")
    with auth_gateway.client("tok-a") as a, auth_gateway.client("tok-b") as b:
        assert a.post("/v1/jobs", json={"prompt": "Hi", "max_tokens": 1, "job_id": theirs})
        routes = [("GET", "/v1/jobs/{}"), ("GET", "/v1/jobs/{}/result?timeout_s=0.1"),
                  ("POST", "/v1/jobs/{}/cancel"), ("GET", "/v1/jobs/{}/events")]  # fmt: skip
        for method, path in routes:
            got = b.request(method, path.format(theirs))
            missing = b.request(method, path.format(never))
            assert got.status_code == missing.status_code == 404, (path, got.text)
            assert got.text == missing.text.replace(never, theirs)
        for job_id in (theirs, never):
            created = b.post("/v1/jobs", json={"prompt": "Hi", "max_tokens": 1, "job_id": job_id})
            assert created.status_code == 201, created.text
        assert a.get(f"/v1/jobs/{theirs}").json()["tenant"] == "tenant-a"


def test_no_chosen_id_reaches_another_tenant(idle_auth_gateway: Served) -> None:
    from gateway.tenancy import IdScope

    job_id = new_id()
    with idle_auth_gateway.client("tok-a") as a, idle_auth_gateway.client("tok-b") as b:
        assert a.post("/v1/jobs", json={"prompt": "Hi", "job_id": job_id}).status_code == 201
        forged = IdScope.of("tenant-a").internal(job_id)  # A's job's id in the job plane
        assert b.get(f"/v1/jobs/{forged}").status_code == 404
        assert b.post(f"/v1/jobs/{forged}/cancel").status_code == 404
        created = b.post("/v1/jobs", json={"prompt": "Hi", "job_id": forged})
        assert created.status_code == 201 and created.json()["created"] is True
        status = a.get(f"/v1/jobs/{job_id}").json()
        assert (status["state"], status["tenant"]) == ("queued", "tenant-a")
        for client, own in ((a, job_id), (b, forged)):
            assert client.post(f"/v1/jobs/{own}/cancel").json()["outcome"] == "cancelled"


def test_answers_name_the_clients_id(idle_auth_gateway: Served) -> None:
    job_id = new_id()
    with idle_auth_gateway.client("tok-a") as a:
        created = a.post("/v1/jobs", json={"prompt": "Hi", "job_id": job_id})
        waited = a.get(f"/v1/jobs/{job_id}/result", params={"timeout_s": 0.1})
        assert waited.status_code == 504 and job_id in waited.json()["error"]["message"]
        status = a.get(f"/v1/jobs/{job_id}")
        assert status.json()["job_id"] == job_id and status.json()["state"] == "queued"
        recent = a.get("/v1/status", params={"recent": 100})
        assert job_id in [r["job_id"] for r in recent.json()["recent"]]
        cancel = a.post(f"/v1/jobs/{job_id}/cancel")
        assert cancel.json() == {"job_id": job_id, "outcome": "cancelled"}
        ended = a.get(f"/v1/jobs/{job_id}/result")
        assert ended.status_code == 409 and ended.json()["error"]["job_id"] == job_id
        assert job_id in ended.json()["error"]["message"]
        events = events_of(a, job_id)
        for response in (created, waited, status, recent, cancel, ended):
            assert_no_other_id(response.text, job_id)
        assert [e["event"] for e in events] == ["cancelled"]
        chat_body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
        chat = a.post("/v1/chat/completions", json=chat_body)
        assert chat.status_code == 504, chat.text  # nobody runs it; the gateway cancels it
        timed_out = chat.json()["error"]["job_id"]
        assert a.get(f"/v1/jobs/{timed_out}").json()["state"] == "cancelled"
        assert_no_other_id(chat.text, timed_out)


def test_openai_job_id_is_the_tenants(auth_gateway: Served) -> None:
    client = openai.OpenAI(api_key="tok-b", base_url=f"{auth_gateway.url}/v1", max_retries=0)
    raw = client.completions.with_raw_response.create(model="x", prompt="Hi", max_tokens=2)
    job_id = raw.headers["X-Paternoster-Job-Id"]
    assert raw.parse().id == f"cmpl-{job_id}" and JOB_ID_PATTERN.match(job_id)
    with auth_gateway.client("tok-b") as b, auth_gateway.client("tok-a") as a:
        status = b.get(f"/v1/jobs/{job_id}").json()
        assert (status["job_id"], status["tenant"]) == (job_id, "tenant-b")
        assert a.get(f"/v1/jobs/{job_id}").status_code == 404


def test_id_rules_behind_auth(idle_auth_gateway: Served, idle_gateway: Served) -> None:
    from gateway.tenancy import SCOPED_ID_CHARS

    longest = "a" + uuid.uuid4().hex * 4
    with idle_auth_gateway.client("tok-a") as a, idle_gateway.client() as plain:
        ok = a.post("/v1/jobs", json={"prompt": "Hi", "job_id": longest[:SCOPED_ID_CHARS]})
        assert ok.status_code == 201, ok.text
        too_long = a.post("/v1/jobs", json={"prompt": "Hi", "job_id": longest[:MAX_JOB_ID_CHARS]})
        assert too_long.status_code == 422, too_long.text
        message = too_long.json()["error"]["message"]
        assert "job_id" in message and str(SCOPED_ID_CHARS) in message
        assert a.get(f"/v1/jobs/{longest[:MAX_JOB_ID_CHARS]}").status_code == 404
        # Without auth the protocol's own limit applies.
        plain_id = longest[:MAX_JOB_ID_CHARS]
        assert plain.post("/v1/jobs", json={"prompt": "Hi", "job_id": plain_id}).status_code == 201
        for client, job_id in ((a, longest[:SCOPED_ID_CHARS]), (plain, plain_id)):
            assert client.post(f"/v1/jobs/{job_id}/cancel").json()["outcome"] == "cancelled"


def test_without_auth_ids_are_the_job_planes(
    gateway: Served, gw_prefix: str, client: redis.Redis
) -> None:
    job_id = new_id()
    with gateway.client() as http:
        http.post("/v1/jobs", json={"prompt": "Hi", "max_tokens": 1, "job_id": job_id})
        assert http.get(f"/v1/jobs/{job_id}/result").status_code == 200
    assert client.hget(Keys(gw_prefix).job(job_id), "state") == "done"


tenants = st.text(min_size=1, max_size=64)
client_ids = st.from_regex(JOB_ID_PATTERN, fullmatch=True)


@given(tenants, tenants, client_ids, client_ids)
def test_scoped_ids_are_valid_and_distinct(t1: str, t2: str, x: str, y: str) -> None:
    from gateway.tenancy import IdScope

    one, two = IdScope.of(t1), IdScope.of(t2)
    for scope, job_id in ((one, x), (two, y)):
        if scope.accepts(job_id):
            internal = scope.internal(job_id)
            assert JOB_ID_PATTERN.match(internal) and scope.owns(internal)
            assert scope.external(internal) == job_id
    if one.accepts(x) and two.accepts(y) and (t1, x) != (t2, y):
        assert one.internal(x) != two.internal(y)
    assert IdScope.of(None).internal(x) == x and IdScope.of(None).accepts(x)


def test_tenants_sharing_a_scope_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway import tenancy

    GatewayConfig(tokens=TOKENS)
    monkeypatch.setattr(tenancy, "scope_tag", lambda tenant: "0" * tenancy.SCOPE_TAG_CHARS)
    with pytest.raises(ValueError, match="tenant-a"):
        GatewayConfig(tokens=TOKENS)
    GatewayConfig(tokens={"t1": "same", "t2": "same"})  # one tenant with two tokens is fine
