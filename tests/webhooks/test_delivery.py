"""Durable, at-least-once delivery: retries, Retry-After, dead letters, take-over, refusals."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from gateway.webhooks.records import Record
from producer.keys import Keys
from producer.webhook_policy import IPAddress
from tests.webhooks.conftest import Receiver, cancelled_jobs, deliver_until, serving
from worker.cli import main as paternoster


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _drained(client: Any, keys: Keys) -> bool:
    return client.xlen(keys.webhooks) == 0


def test_500s_then_success_give_one_verified_delivery_per_job(
    redis_url: str, key_prefix: str, client: Any
) -> None:
    receiver = Receiver(answer=lambda _d, n: (500, {}) if n <= 3 else (200, {}))
    keys = Keys(key_prefix)
    with serving(receiver) as url:
        ids = cancelled_jobs(redis_url, key_prefix, url, 5)
        (d,) = asyncio.run(deliver_until(redis_url, key_prefix, lambda: _drained(client, keys)))
    assert receiver.by_job() == {job_id: 1 for job_id in ids} and receiver.bad == 0
    assert set(receiver.attempts.values()) == {4}  # three 500s, then the 2xx
    body = receiver.verified[next(iter(receiver.verified))]
    assert body["type"] == "job.cancelled" and body["data"]["state"] == "cancelled"
    fields = client.hgetall(keys.delivery(ids[0]))
    assert fields["terminal_attempts"] == "4" and fields["terminal_outcome"] == "delivered"
    assert fields["terminal_last_status"] == "200" and float(fields["terminal_delivered_at"]) > 0
    assert "secret" not in str(fields)
    metrics = d.metrics.render().decode()  # type: ignore[union-attr]
    assert 'paternoster_webhook_attempts_total{result="5xx"} 15.0' in metrics
    assert 'paternoster_webhook_deliveries_total{outcome="delivered"} 5.0' in metrics
    assert "paternoster_webhook_attempt_seconds_count 20.0" in metrics


def test_retry_after_is_honoured(redis_url: str, key_prefix: str, client: Any) -> None:
    receiver = Receiver(answer=lambda _d, n: (429, {"retry-after": "1"}) if n == 1 else (200, {}))
    with serving(receiver) as url:
        cancelled_jobs(redis_url, key_prefix, url, 1)
        # backoff_max_s also caps what Retry-After may ask: 5 s here
        done = lambda: len(receiver.verified) == 1  # noqa: E731
        asyncio.run(deliver_until(redis_url, key_prefix, done, backoff_max_s=5.0))
    (times,) = receiver.times.values()
    assert len(times) == 2 and times[1] - times[0] >= 0.95  # backoff alone would be ~10 ms


def test_an_unreachable_receiver_ends_in_the_dead_letter_after_max_attempts(
    redis_url: str, key_prefix: str, client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = Keys(key_prefix)
    url = f"http://127.0.0.1:{_free_port()}/hook"  # nothing listens there
    (job_id,) = cancelled_jobs(redis_url, key_prefix, url, 1)
    asyncio.run(
        deliver_until(
            redis_url, key_prefix, lambda: client.xlen(keys.webhook_dead) == 1, max_attempts=4
        )
    )
    ((_, dead),) = client.xrange(keys.webhook_dead)
    assert dead["id"] == job_id and dead["attempts"] == "4" and dead["last_status"] == "0"
    assert "after 4 attempts" in dead["reason"] and "ConnectError" in dead["reason"]
    assert (
        _drained(client, keys) and not client.xpending(keys.webhooks, keys.webhook_group)["pending"]
    )
    assert client.hget(keys.delivery(job_id), "terminal_outcome") == "dead_letter"
    assert paternoster(["webhooks", "dead", "--redis-url", redis_url, "--prefix", key_prefix]) == 0
    assert f'"id": "{job_id}"' in capsys.readouterr().out
    assert paternoster(["webhooks", "stats", "--redis-url", redis_url, "--prefix", key_prefix]) == 0
    assert '"dead": 1' in capsys.readouterr().out


@pytest.mark.parametrize(("status", "extra"), [(404, {}), (302, {"location": "http://10.0.0.1/"})])
def test_4xx_and_redirects_are_not_retried(
    redis_url: str, key_prefix: str, client: Any, status: int, extra: dict[str, str]
) -> None:
    keys = Keys(key_prefix)
    receiver = Receiver(answer=lambda _d, _n: (status, extra))
    with serving(receiver) as url:
        cancelled_jobs(redis_url, key_prefix, url, 1)
        asyncio.run(
            deliver_until(redis_url, key_prefix, lambda: client.xlen(keys.webhook_dead) == 1)
        )
    assert list(receiver.attempts.values()) == [1] and not receiver.verified
    ((_, dead),) = client.xrange(keys.webhook_dead)
    assert dead["last_status"] == str(status)
    assert ("not followed" in dead["reason"]) == (status == 302)


def test_a_name_resolving_to_loopback_is_refused_unless_allowed(
    redis_url: str, key_prefix: str, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = Keys(key_prefix)
    receiver = Receiver()
    with serving(receiver) as url:
        port = url.split(":")[2].split("/")[0]
        named = f"http://hooks.example.test:{port}/hook"  # a name: it passes submit
        monkeypatch.setenv("PATERNOSTER_WEBHOOK_ALLOW", "")
        cancelled_jobs(redis_url, key_prefix, named, 1)

        async def to_loopback(_host: str, _port: int) -> list[IPAddress]:
            return [ipaddress.ip_address("127.0.0.1")]

        async def run(done: Callable[[], bool]) -> None:
            await deliver_until(redis_url, key_prefix, done, resolve=to_loopback)

        asyncio.run(run(lambda: client.xlen(keys.webhook_dead) > 0))
        assert not receiver.attempts  # nothing was sent
        ((_, dead),) = client.xrange(keys.webhook_dead)
        assert "loopback" in dead["reason"] and dead["attempts"] == "1"
        monkeypatch.setenv("PATERNOSTER_WEBHOOK_ALLOW", "127.0.0.1")
        (job_id,) = cancelled_jobs(redis_url, key_prefix, named, 1)
        asyncio.run(run(lambda: len(receiver.verified) > 0))
    assert receiver.by_job() == {job_id: 1}  # pinned to 127.0.0.1, Host kept


def test_a_deliverer_killed_mid_delivery_is_taken_over(
    redis_url: str, key_prefix: str, client: Any
) -> None:
    """The first deliverer dies while its POST waits for an answer: its entry stays pending
    under it, and a second deliverer takes it over once it has been idle claim_idle_s."""
    keys = Keys(key_prefix)

    def answer(_did: str, n: int) -> tuple[int, dict[str, str]]:
        if n == 1:
            time.sleep(1.0)  # the first deliverer is gone before this answer
            return 500, {}
        return 200, {}

    receiver = Receiver(answer=answer)
    with serving(receiver) as url:
        (job_id,) = cancelled_jobs(redis_url, key_prefix, url, 1)
        asyncio.run(deliver_until(redis_url, key_prefix, lambda: bool(receiver.attempts)))
        pending = client.xpending(keys.webhooks, keys.webhook_group)
        assert pending["pending"] == 1  # killed: not acknowledged, not forgotten
        asyncio.run(deliver_until(redis_url, key_prefix, lambda: _drained(client, keys)))
    assert receiver.by_job() == {job_id: 1}
    assert receiver.attempts[next(iter(receiver.attempts))] == 2  # the same webhook-id again


def test_records_read_back_what_they_wrote() -> None:
    record = Record(
        "j:terminal:1.0", url="http://h/", attempts=3, last_status=503, next_attempt_at=9.5
    )
    again = Record.from_hash(
        "terminal", {k: str(v) for k, v in record.to_hash("terminal").items()}, "j:terminal:1.0"
    )
    assert again == record
    assert Record.from_hash("terminal", record.to_hash("terminal"), "j:terminal:2.0").attempts == 0  # type: ignore[arg-type]
