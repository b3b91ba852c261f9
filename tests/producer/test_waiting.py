"""``status()`` of a queued job: why it waits (``wait_reason``) and how many jobs are ahead of it
(``position``), from the workers' heartbeats and the bands' streams."""

from __future__ import annotations

import asyncio
import time

import redis

from producer import AsyncProducer, JobState, Keys, Producer
from producer.fleet import HEARTBEAT_TTL_S, WorkerInfo, queue_depths
from producer.results import JobStatus
from producer.waiting import BEHIND_HIGHER_PRIORITY, NO_WORKER, WORKERS_BUSY
from tests.producer.fake_worker import FakeWorker


def heartbeat(client: redis.Redis, keys: Keys, name: str = "w1", age_s: float = 0.0) -> None:
    """What a live worker writes about itself (``producer.fleet``)."""
    at = time.time() - age_s
    info = WorkerInfo(name=name, host="h", pid=1, heartbeat_at=at, max_num_seqs=4)
    client.hset(keys.worker(name), mapping=info.to_hash())  # type: ignore[arg-type]
    client.expire(keys.worker(name), HEARTBEAT_TTL_S)
    client.zadd(keys.workers, {name: at})


def where(producer: Producer, job_id: str) -> tuple[str | None, int | None]:
    status = producer.status(job_id)
    assert status.state is JobState.QUEUED
    return status.wait_reason, status.position


def test_no_live_worker(producer: Producer, client: redis.Redis, keys: Keys) -> None:
    producer.submit("x", job_id="a")
    producer.submit("x", job_id="b")
    assert where(producer, "a") == (NO_WORKER, 0)
    assert where(producer, "b") == (NO_WORKER, 1)
    heartbeat(client, keys, "old", age_s=HEARTBEAT_TTL_S + 5)  # stopped beating
    client.zadd(keys.workers, {"gone": time.time()})  # its hash expired already
    assert where(producer, "b") == (NO_WORKER, 1)


def test_workers_busy_counts_the_entries_ahead_in_its_band(
    producer: Producer, client: redis.Redis, keys: Keys
) -> None:
    heartbeat(client, keys)
    for i in range(4):
        producer.submit("x", job_id=f"j{i}")
    producer.submit("x", job_id="later", priority="batch")  # less urgent: not ahead of anyone
    assert where(producer, "j3") == (WORKERS_BUSY, 3)  # no group yet: from the stream's start
    worker = FakeWorker(client, keys)
    assert worker.take().job_id == "j0"
    assert where(producer, "j3") == (WORKERS_BUSY, 2)  # after the group's last-delivered id
    assert where(producer, "j1") == (WORKERS_BUSY, 0)
    assert producer.cancel("j1") == "cancelled"
    assert where(producer, "j3") == (WORKERS_BUSY, 2)  # a cancelled entry counts until read


def test_behind_higher_priority(producer: Producer, client: redis.Redis, keys: Keys) -> None:
    heartbeat(client, keys)
    FakeWorker(client, keys)  # the groups exist: depths are the groups' lag
    producer.submit("x", job_id="b0", priority="batch")
    producer.submit("x", job_id="b1", priority="batch")
    assert where(producer, "b1") == (WORKERS_BUSY, 1)
    producer.submit("x", job_id="i0", priority="interactive")
    producer.submit("x", job_id="d0")
    producer.submit("x", job_id="d1")
    assert where(producer, "b1") == (BEHIND_HIGHER_PRIORITY, 1 + 2 + 1)
    assert where(producer, "d1") == (BEHIND_HIGHER_PRIORITY, 1 + 1)
    assert where(producer, "i0") == (WORKERS_BUSY, 0)
    assert queue_depths(client, keys) == {"interactive": 1, "default": 2, "batch": 2}


def test_other_states_are_not_given_a_wait_reason(
    producer: Producer, client: redis.Redis, keys: Keys, worker: FakeWorker
) -> None:
    producer.submit("x", job_id="r")
    worker.take()
    status = producer.status("r")
    assert status.state is JobState.RUNNING and status.wait_reason is None
    # What a worker writes for a job it holds but has not scheduled (or has preempted).
    client.hset(keys.job("r"), mapping={"wait_reason": "kv_full", "position": 2, "preemptions": 1})
    status = producer.status("r")
    assert (status.wait_reason, status.position, status.preemptions) == ("kv_full", 2, 1)


def test_status_fields_parse_from_the_hash() -> None:
    fields = {"state": "queued", "band": "batch", "cost_tokens": "42", "position": "7"}
    status = JobStatus.from_hash("j", fields)
    assert (status.band, status.cost_tokens, status.position) == ("batch", 42, 7)


def test_the_async_client_says_the_same(
    producer: Producer, client: redis.Redis, keys: Keys, redis_url: str, key_prefix: str
) -> None:
    heartbeat(client, keys)
    producer.submit("x", job_id="i0", priority="interactive")
    producer.submit("x", job_id="b0", priority="batch")

    async def main() -> tuple[tuple[str | None, int | None], ...]:
        async with AsyncProducer(redis_url, prefix=key_prefix) as p:
            out = []
            for job_id in ("i0", "b0"):
                status = await p.status(job_id)
                out.append((status.wait_reason, status.position))
            return tuple(out)

    assert asyncio.run(main()) == ((WORKERS_BUSY, 0), (BEHIND_HIGHER_PRIORITY, 1))
    assert where(producer, "b0") == (BEHIND_HIGHER_PRIORITY, 1)
