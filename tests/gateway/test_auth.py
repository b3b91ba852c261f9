"""Bearer-token auth: 401 without a good token, and the tenant always the token's."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from gateway.config import GatewayConfig, load_tokens
from tests.gateway.conftest import Served


def test_no_or_bad_token_is_401(auth_gateway: Served) -> None:
    for token in (None, "wrong"):
        with auth_gateway.client(token) as client:
            for method, path in [
                ("GET", "/v1/models"),
                ("POST", "/v1/jobs"),
                ("GET", "/v1/jobs/x"),
            ]:
                response = client.request(method, path, json={"prompt": "a"})
                assert response.status_code == 401, (token, path)
                assert response.json()["error"]["type"] == "authentication_error"
                assert response.headers["WWW-Authenticate"] == "Bearer"
    with auth_gateway.client() as client:
        client.headers["Authorization"] = "Basic tok-a"
        assert client.get("/v1/models").status_code == 401


def test_tenant_from_token_not_body(auth_gateway: Served) -> None:
    with auth_gateway.client("tok-a") as a, auth_gateway.client("tok-b") as b:
        created = a.post("/v1/jobs", json={"prompt": "Hi", "max_tokens": 2, "tenant": "evil"})
        assert created.status_code == 201, created.text
        job_id = created.json()["job_id"]
        assert a.get(f"/v1/jobs/{job_id}").json()["tenant"] == "tenant-a"
        # Another tenant cannot tell the job exists, let alone read or cancel it.
        assert b.get(f"/v1/jobs/{job_id}").status_code == 404
        assert b.post(f"/v1/jobs/{job_id}/cancel").status_code == 404
        assert a.get(f"/v1/jobs/{job_id}/result").status_code == 200


def test_openai_client_with_token(auth_gateway: Served) -> None:
    client = openai.OpenAI(api_key="tok-b", base_url=f"{auth_gateway.url}/v1", max_retries=0)
    out = client.completions.create(model="x", prompt="Hi", max_tokens=2, user="someone-else")
    job_id = out.id.removeprefix("cmpl-")
    with auth_gateway.client("tok-b") as b:
        assert b.get(f"/v1/jobs/{job_id}").json()["tenant"] == "tenant-b"
    bad = openai.OpenAI(api_key="nope", base_url=f"{auth_gateway.url}/v1", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_user_is_tenant_without_auth(gateway: Served) -> None:
    client = openai.OpenAI(api_key="unused", base_url=f"{gateway.url}/v1", max_retries=0)
    out = client.completions.create(model="x", prompt="Hi", max_tokens=2, user="acme")
    with gateway.client() as http:
        assert http.get(f"/v1/jobs/{out.id.removeprefix('cmpl-')}").json()["tenant"] == "acme"


@pytest.mark.parametrize("content", ["not json", "[]", "{}", '{"t": ""}', '{"": "x"}'])
def test_bad_tokens_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="tokens file"):
        load_tokens(path)


def test_tokens_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"t": "tenant"}))
    monkeypatch.setenv("PATERNOSTER_GATEWAY_TOKENS", str(path))
    config = GatewayConfig.from_env(prefix="p")
    assert config.auth_enabled and config.tokens == {"t": "tenant"} and config.prefix == "p"
    monkeypatch.delenv("PATERNOSTER_GATEWAY_TOKENS")
    assert not GatewayConfig.from_env().auth_enabled
