"""Safe by default: what a webhook URL may name, refused at submit before any connection."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from pydantic import ValidationError

from producer.protocol import JobSpec
from producer.webhook_policy import Allowlist, WebhookRefused, check_url
from worker.service.job_parsing import PromptLimits, Rejected, parse_job


def job(**webhook: Any) -> JobSpec:
    return JobSpec.model_validate({"prompt": "x", "webhook": webhook})


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any lookup or connection during the test fails it: refusals happen before them."""

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the check tried the network")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://10.0.0.1/hook", "private"),
        ("http://[::1]:8080/hook", "loopback"),
        ("http://[fd00::1]/hook", "private"),  # unique-local
        ("http://224.0.0.1/hook", "multicast"),
        ("http://0.0.0.0/hook", "unspecified"),
        ("http://[::ffff:169.254.169.254]/", "link-local"),  # IPv4-mapped
        ("http://localhost:9000/hook", "loopback"),
        ("http://api.localhost/hook", "loopback"),
        ("ftp://example.com/hook", "scheme"),
        ("file:///etc/passwd", "scheme"),
        ("http://user:pw@example.com/hook", "credentials"),
    ],
)
def test_unsafe_urls_are_refused_at_submit(url: str, why: str, no_network: None) -> None:
    with pytest.raises(ValidationError, match=why) as err:
        job(url=url)
    assert err.value.errors()[0]["loc"] == ("webhook", "url")


def test_loopback_passes_once_allowlisted_and_not_before(
    monkeypatch: pytest.MonkeyPatch, no_network: None
) -> None:
    job(url="http://127.0.0.1:9/hook")  # the autouse allowlist names it
    monkeypatch.setenv("PATERNOSTER_WEBHOOK_ALLOW", "")
    with pytest.raises(ValidationError, match="loopback"):
        job(url="http://127.0.0.1:9/hook")


def test_the_allowlist_takes_networks_and_host_names(no_network: None) -> None:
    allow = Allowlist.parse("10.0.0.0/8, hooks.internal ,")
    assert check_url("http://10.1.2.3/x", allow).literal is not None
    assert check_url("https://hooks.internal/x", allow).allowed_name
    with pytest.raises(WebhookRefused, match="private"):
        check_url("http://192.168.1.1/x", allow)


def test_public_addresses_and_names_pass_without_a_lookup(no_network: None) -> None:
    job(url="https://93.184.216.34/hook")
    spec = job(url="https://hooks.example.com/done")
    assert spec.webhook is not None and spec.webhook.events == ("terminal",)


def test_events_are_checked() -> None:
    with pytest.raises(ValidationError, match="events"):
        job(url="https://a.example/", events=[])
    with pytest.raises(ValidationError, match="repeat"):
        job(url="https://a.example/", events=["started"] * 2)


class _Vocab:
    def get_vocab(self) -> dict[str, int]:
        return {"a": 0}


def test_the_worker_refuses_a_payload_that_skipped_the_producer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job XADDed by hand (another language, redis-cli) is checked again by the worker."""
    payload = json.dumps({"id": "j1", "prompt": "x", "webhook": {"url": "http://10.0.0.1/"}})
    with pytest.raises(Rejected) as err:
        parse_job("j1", payload, PromptLimits(_Vocab(), 64, 10))
    assert "webhook.url" in err.value.message and "private" in err.value.message
