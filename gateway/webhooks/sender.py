"""One delivery attempt: the address checked, one POST, its answer classified.

The URL is checked again here (``producer.webhook_policy``): a host name is resolved, every
address it resolves to must pass, and the request goes to the checked address itself (its
``Host`` header and TLS server name kept), so a second lookup cannot rebind the name to a
private address. No redirect is followed; the attempt is bounded in time and in what is read.
"""

from __future__ import annotations

import asyncio
import email.utils
import enum
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx

from producer import webhook_policy as policy

Resolver = Callable[[str, int], Awaitable[Sequence[policy.IPAddress]]]
ERROR_CHARS = 200  # of a receiver's answer, kept as the record's last_error


class Verdict(enum.StrEnum):
    DELIVERED = "delivered"  # 2xx
    RETRY = "retry"  # timeout, connection error, 408, 429, 5xx
    FAIL = "fail"  # another answer (3xx: redirects are not followed, 4xx): not retried
    REFUSED = "refused"  # the address policy refused it: nothing was sent


@dataclass(frozen=True)
class Attempt:
    verdict: Verdict
    result: str  # the metrics' label: 2xx, 3xx, 4xx, 429, 5xx, timeout, connection, refused
    status: int = 0
    error: str = ""
    retry_after_s: float | None = None
    seconds: float = 0.0


async def system_resolver(host: str, port: int) -> list[policy.IPAddress]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(info[4][0]) for info in infos]


def retry_after_s(value: str | None, now_s: float) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP date; None if absent."""
    if not value:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now_s)


def _classify(status: int, headers: httpx.Headers, text: str) -> Attempt:
    if 200 <= status < 300:
        return Attempt(Verdict.DELIVERED, "2xx", status)
    error = f"HTTP {status}: {text[:ERROR_CHARS]}".strip()
    if status == 429 or status == 408 or status >= 500:
        wait = retry_after_s(headers.get("retry-after"), time.time())
        label = "429" if status == 429 else ("5xx" if status >= 500 else "4xx")
        return Attempt(Verdict.RETRY, label, status, error, wait)
    if 300 <= status < 400:
        error = f"HTTP {status}: redirects are not followed (to {headers.get('location')!r})"
        return Attempt(Verdict.FAIL, "3xx", status, error)
    return Attempt(Verdict.FAIL, "4xx", status, error)


@dataclass(frozen=True)
class Sender:
    http: httpx.AsyncClient
    resolve: Resolver
    allow: policy.Allowlist
    timeout_s: float
    max_response_bytes: int

    async def _where(self, url: str) -> tuple[str, dict[str, str], dict[str, str]]:
        """The URL to connect to, the headers that name the host, the request extensions."""
        target = policy.check_url(url, self.allow)
        if target.literal is not None or target.allowed_name:
            return url, {}, {}
        address = policy.check_resolved(
            target, await self.resolve(target.host, target.port), self.allow
        )
        parsed = httpx.URL(url)
        pinned = parsed.copy_with(host=str(address))
        host = parsed.netloc.decode("ascii")
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        return str(pinned), {"host": host}, extensions

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> Attempt:
        start = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                attempt = await self._post(url, headers, body)
        except policy.WebhookRefused as exc:
            attempt = Attempt(Verdict.REFUSED, "refused", error=str(exc))
        except (TimeoutError, httpx.TimeoutException):
            attempt = Attempt(Verdict.RETRY, "timeout", error=f"no answer in {self.timeout_s} s")
        except (httpx.TransportError, OSError) as exc:  # refused, reset, DNS failure ...
            attempt = Attempt(Verdict.RETRY, "connection", error=f"{type(exc).__name__}: {exc}")
        return Attempt(**{**attempt.__dict__, "seconds": time.perf_counter() - start})

    async def _post(self, url: str, headers: dict[str, str], body: bytes) -> Attempt:
        where, host, extensions = await self._where(url)
        request = self.http.build_request(
            "POST", where, content=body, headers={**headers, **host}, extensions=extensions
        )
        response = await self.http.send(request, stream=True, follow_redirects=False)
        try:
            read = bytearray()
            async for chunk in response.aiter_raw():
                read += chunk
                if len(read) >= self.max_response_bytes:
                    break  # enough: the status line decided already
        finally:
            await response.aclose()
        text = bytes(read[: self.max_response_bytes]).decode("utf-8", "replace")
        return _classify(response.status_code, response.headers, text)
