"""One attempt: a resolved name is pinned to its checked address; slow answers time out."""

from __future__ import annotations

import asyncio
import ipaddress
import time

import httpx

from gateway.webhooks import signing
from gateway.webhooks.sender import Attempt, Sender, Verdict, retry_after_s
from producer.webhook_policy import Allowlist, IPAddress
from tests.webhooks.conftest import SECRET, Receiver, serving


async def _public(_host: str, _port: int) -> list[IPAddress]:
    return [ipaddress.ip_address("93.184.216.34")]


def _sender(http: httpx.AsyncClient, timeout_s: float = 2.0) -> Sender:
    return Sender(http, _public, Allowlist.parse("127.0.0.1"), timeout_s, 1024)


def test_a_name_is_pinned_to_the_address_it_was_checked_at() -> None:
    async def where() -> tuple[str, dict[str, str], dict[str, str]]:
        async with httpx.AsyncClient() as http:
            return await _sender(http)._where("https://hooks.example.com:8443/done?x=1")

    url, host, extensions = asyncio.run(where())
    assert url == "https://93.184.216.34:8443/done?x=1"
    assert host == {"host": "hooks.example.com:8443"}
    assert extensions == {"sni_hostname": "hooks.example.com"}  # TLS checks the name


def test_a_slow_receiver_is_a_timeout_to_retry() -> None:
    def slow(_did: str, _n: int) -> tuple[int, dict[str, str]]:
        time.sleep(1.0)
        return 200, {}

    receiver = Receiver(answer=slow)

    async def post(url: str) -> Attempt:
        async with httpx.AsyncClient() as http:
            headers = signing.headers(SECRET, "d", int(time.time()), b"{}")
            return await _sender(http, timeout_s=0.2).post(url, headers, b"{}")

    with serving(receiver) as url:
        attempt = asyncio.run(post(url))
    assert attempt.verdict is Verdict.RETRY and attempt.result == "timeout"
    assert attempt.seconds < 0.5


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_s("7", 0.0) == 7.0
    assert retry_after_s("Thu, 01 Jan 1970 00:01:40 GMT", 40.0) == 60.0
    assert retry_after_s("soon", 0.0) is None and retry_after_s(None, 0.0) is None
