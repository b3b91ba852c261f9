"""A delivery still to make after its job's result TTL passed (deliverers behind, or one taken
over late) is a dead letter saying so, nothing sent; and one enqueued for an earlier life of a
job id does not deliver the later life's result under its own delivery id."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gateway.webhooks.prepare import GONE, RESUBMITTED
from producer import Producer
from producer.keys import Keys
from producer.protocol import JobSpec
from tests.webhooks.conftest import SECRET, Receiver, cancelled_jobs, deliver_until, serving


def _expire(client: Any, keys: Keys, job_id: str) -> None:
    """What the result TTL does: the status hash and the events go."""
    for key in (keys.job(job_id), keys.events(job_id)):
        client.pexpire(key, 1)
    time.sleep(0.01)
    assert not client.exists(keys.job(job_id), keys.events(job_id))


def _deliver(redis_url: str, prefix: str, client: Any) -> None:
    keys = Keys(prefix)
    done = lambda: client.xlen(keys.webhooks) == 0  # noqa: E731
    asyncio.run(deliver_until(redis_url, prefix, done))


def test_a_delivery_after_the_result_ttl_is_a_dead_letter(
    redis_url: str, key_prefix: str, client: Any
) -> None:
    keys, receiver = Keys(key_prefix), Receiver()
    with serving(receiver) as url:
        (job_id,) = cancelled_jobs(redis_url, key_prefix, url, 1)
        _expire(client, keys, job_id)
        _deliver(redis_url, key_prefix, client)
    assert receiver.attempts == {}  # nothing sent
    ((_, dead),) = client.xrange(keys.webhook_dead)
    assert dead["id"] == job_id and dead["reason"] == GONE and dead["attempts"] == "0"
    record = client.hgetall(keys.delivery(job_id))
    assert record["terminal_outcome"] == "dead_letter" and record["terminal_last_error"] == GONE


def test_an_earlier_life_of_a_job_id_is_not_delivered_as_the_later_one(
    redis_url: str, key_prefix: str, client: Any
) -> None:
    keys, receiver = Keys(key_prefix), Receiver()
    with serving(receiver) as url, Producer(redis_url, prefix=key_prefix) as producer:
        hook = {"url": url, "secret": SECRET}
        spec = JobSpec.model_validate({"prompt": "again", "webhook": hook})
        producer.submit_spec(spec).cancel()
        first = client.hget(keys.job(spec.id), "submitted_at")
        _expire(client, keys, spec.id)
        producer.submit_spec(spec).cancel()  # the same id, a new life
        second = client.hget(keys.job(spec.id), "submitted_at")
        _deliver(redis_url, key_prefix, client)
    assert first != second
    ((_, dead),) = client.xrange(keys.webhook_dead)
    assert dead["delivery_id"] == f"{spec.id}:terminal:{first}"
    assert dead["reason"] == f"{RESUBMITTED} (submitted at {first}, now {second})"
    assert list(receiver.verified) == [f"{spec.id}:terminal:{second}"]  # the later life's own
    assert receiver.by_job() == {spec.id: 1}


def test_a_status_hash_without_a_webhook_says_so(
    redis_url: str, key_prefix: str, client: Any
) -> None:
    keys = Keys(key_prefix)
    client.hset(keys.job("bare"), mapping={"state": "done", "submitted_at": "1.000000"})
    client.xadd(keys.webhooks, {"id": "bare", "event": "terminal", "submitted_at": "1.000000"})
    _deliver(redis_url, key_prefix, client)
    ((_, dead),) = client.xrange(keys.webhook_dead)
    assert dead["reason"] == "the job's status hash holds no webhook (not submitted through SUBMIT)"


def test_a_delivery_in_hand_stops_retrying_once_its_job_expired(
    redis_url: str, key_prefix: str, client: Any
) -> None:
    """The same end as a deliverer that takes it over later: no attempt after the TTL."""
    keys = Keys(key_prefix)
    ids: list[str] = []

    def fail_and_expire(_did: str, n: int) -> tuple[int, dict[str, str]]:
        if n == 2:
            _expire(client, keys, ids[0])  # between the second attempt and the third
        return 500, {}

    receiver = Receiver(answer=fail_and_expire)
    with serving(receiver) as url:
        ids += cancelled_jobs(redis_url, key_prefix, url, 1)
        _deliver(redis_url, key_prefix, client)
    assert list(receiver.attempts.values()) == [2]
    ((_, dead),) = client.xrange(keys.webhook_dead)
    assert dead["reason"] == GONE and dead["attempts"] == "2" and dead["last_status"] == "500"
