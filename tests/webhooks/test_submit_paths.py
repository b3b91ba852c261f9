"""A webhook on every submit path: ``Producer.submit`` (sync and async), ``paternoster
submit``, the gateway's ``/v1/jobs`` and the OpenAI routes; a refused address is refused by
each, naming ``webhook.url``, before anything is enqueued."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from producer import AsyncProducer, InvalidJob, JobSpec, Keys, Producer
from tests.webhooks.conftest import SECRET
from worker.cli import main

URL = "http://127.0.0.1:9/hook"


def _stored_webhook(client: Any, prefix: str, job_id: str) -> dict[str, Any]:
    """The webhook SUBMIT copied into the job's status hash."""
    raw = client.hget(Keys(prefix).job(job_id), "webhook")
    assert raw is not None, "SUBMIT stored no webhook"
    stored: dict[str, Any] = json.loads(raw)
    return stored


def test_submit_takes_a_url_a_mapping_or_a_spec(
    redis_url: str, key_prefix: str, client: Any
) -> None:
    with Producer(redis_url, prefix=key_prefix) as p:
        by_url = p.submit("hi", webhook=URL).job_id
        spec = JobSpec.model_validate({"prompt": "x", "webhook": {"url": URL}}).webhook
        by_spec = p.submit("hi", webhook=spec).job_id
        with pytest.raises(InvalidJob, match=r"webhook\.url: .*link-local"):
            p.submit("hi", webhook={"url": "http://169.254.169.254/latest"})
    assert _stored_webhook(client, key_prefix, by_url)["url"] == URL
    assert _stored_webhook(client, key_prefix, by_spec)["events"] == ["terminal"]

    async def submit_async() -> str:
        async with AsyncProducer(redis_url, prefix=key_prefix) as ap:
            hook = {"url": URL, "secret": SECRET, "events": ["started"]}
            return (await ap.submit("hi", webhook=hook)).job_id

    stored = _stored_webhook(client, key_prefix, asyncio.run(submit_async()))
    assert stored["events"] == ["started"] and stored["secret"] == SECRET


def _cli(redis_url: str, prefix: str, capsys: Any, *args: str) -> tuple[int, str, str]:
    rc = main(["submit", "--redis-url", redis_url, "--prefix", prefix, "hi", *args])
    out, err = capsys.readouterr()
    return rc, out.strip(), err


def test_the_cli_submits_a_webhook_and_refuses_a_private_address(
    redis_url: str, key_prefix: str, client: Any, capsys: Any
) -> None:
    events = ("--webhook-event", "terminal", "--webhook-event", "started")
    rc, job_id, _ = _cli(redis_url, key_prefix, capsys, "--webhook-url", URL, *events)
    assert rc == 0
    assert _stored_webhook(client, key_prefix, job_id)["events"] == ["terminal", "started"]
    rc, out, err = _cli(redis_url, key_prefix, capsys, "--webhook-url", "http://10.0.0.1/h")
    assert (rc, out) == (2, "")
    assert "webhook.url" in err and "private address (10.0.0.1)" in err
    rc, _, err = _cli(redis_url, key_prefix, capsys, "--webhook-secret", SECRET)
    assert rc == 2 and "need --webhook-url" in err
    assert client.xlen(Keys(key_prefix).jobs) == 1  # only the first was enqueued


def test_the_gateway_routes_take_a_webhook_and_refuse_a_private_address(
    redis_url: str, key_prefix: str, client: Any
) -> None:
    from gateway.config import GatewayConfig
    from tests.gateway.conftest import serve, stop

    served = serve(GatewayConfig(redis_url=redis_url, prefix=key_prefix, request_timeout_s=0.5))
    hook = {"url": URL, "events": ["terminal", "started"]}
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        with served.client() as http:
            native = http.post("/v1/jobs", json={"prompt": "hi", "webhook": hook})
            # No worker reads this prefix: the chat call times out (504) after its job exists.
            openai = http.post("/v1/chat/completions", json={**chat, "webhook": hook})
            refused = [
                http.post(
                    "/v1/jobs", json={"prompt": "hi", "webhook": {"url": "http://10.0.0.1/"}}
                ),
                http.post("/v1/completions", json={"prompt": "hi", "webhook": {"url": "ftp://x/"}}),
            ]
    finally:
        stop(served)
    assert native.status_code == 201 and openai.status_code == 504
    for job_id in (native.json()["job_id"], openai.json()["error"]["job_id"]):
        assert _stored_webhook(client, key_prefix, job_id)["events"] == ["terminal", "started"]
    for answer in refused:
        assert answer.status_code == 422, answer.text
        assert "webhook.url" in answer.text, answer.text
    assert client.xlen(Keys(key_prefix).jobs) == 2  # the refused ones enqueued nothing
