"""AsyncProducer on the same paths as the sync client (each test runs its own event loop)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest
import redis

from producer import (
    AsyncProducer,
    JobCancelled,
    JobExpired,
    JobFailed,
    JobNotFound,
    JobState,
    JobTimeout,
    Keys,
)
from tests.producer.fake_worker import FakeWorker

Body = Callable[[AsyncProducer], Awaitable[None]]


def run(redis_url: str, key_prefix: str, body: Body) -> None:
    async def main() -> None:
        async with AsyncProducer(redis_url, prefix=key_prefix, result_ttl_s=300) as producer:
            await body(producer)

    asyncio.run(main())


def test_submit_is_idempotent_and_status_reads_the_hash(
    redis_url: str, key_prefix: str, client: redis.Redis, keys: Keys
) -> None:
    async def body(p: AsyncProducer) -> None:
        first = await p.submit("one", job_id="a1", max_tokens=4)
        second = await p.submit("two", job_id="a1")
        assert (first.created, second.created) == (True, False)
        status = await first.status()
        assert status.state is JobState.QUEUED and status.tenant == "default"
        with pytest.raises(JobNotFound):
            await p.status("nope")

    run(redis_url, key_prefix, body)
    [(_, fields)] = client.xrange(keys.jobs)
    assert json.loads(fields["payload"])["prompt"] == "one"


def test_cancel_queued_running_and_unknown(
    redis_url: str, key_prefix: str, client: redis.Redis, keys: Keys, worker: FakeWorker
) -> None:
    async def body(p: AsyncProducer) -> None:
        await p.submit("x", job_id="q")
        assert await p.cancel("q") == "cancelled"
        with pytest.raises(JobCancelled):
            await p.result("q")
        await p.submit("x", job_id="r")
        got = worker.read()
        assert got is not None and worker.claim(got[0], "q").outcome == "cancelled"
        job = worker.take()
        assert job.job_id == "r"
        assert await p.cancel("r") == "cancelling"
        assert (await p.status("r")).cancel_requested
        with pytest.raises(JobNotFound):
            await p.cancel("nope")

    run(redis_url, key_prefix, body)
    assert [f["id"] for _, f in client.xrange(keys.cancels)] == ["r"]


def test_stream_resume_and_results(redis_url: str, key_prefix: str, worker: FakeWorker) -> None:
    async def body(p: AsyncProducer) -> None:
        handle = await p.submit("x", job_id="s")
        job = worker.take()
        for i, text in enumerate(["a", "b", "c"]):
            worker.token(job, text, [i])
        worker.done(job, "stop")
        first = []
        async for event in handle.stream():
            first.append(event)
            if len(first) == 2:
                break
        rest = [e async for e in p.stream("s", from_event=first[1].event_id or "")]
        assert [e.type for e in first + rest] == ["started", "token", "token", "token", "done"]
        assert len({e.event_id for e in first + rest}) == 5
        result = await handle.result(timeout_s=5)
        assert (result.state, result.text, result.finish_reason) == (JobState.DONE, "abc", "stop")

    run(redis_url, key_prefix, body)


def test_failed_expired_and_timed_out_jobs(
    redis_url: str, key_prefix: str, worker: FakeWorker
) -> None:
    async def body(p: AsyncProducer) -> None:
        await p.submit("x", job_id="bad")
        got = worker.read()
        assert got is not None
        worker.reject(got[0], "bad", "invalid_prompt", "empty prompt")
        with pytest.raises(JobFailed) as failed:
            await p.result("bad")
        assert failed.value.code == "invalid_prompt"
        await p.submit("x", job_id="late", deadline_s=-1)
        assert worker.take().outcome == "expired"
        with pytest.raises(JobExpired):
            await p.result("late")
        await p.submit("x", job_id="idle")
        with pytest.raises(JobTimeout):
            await p.result("idle", timeout_s=0.2)
        with pytest.raises(JobNotFound):
            await anext(p.stream("nope"))

    run(redis_url, key_prefix, body)


def test_stream_follows_a_worker_publishing_concurrently(
    redis_url: str, key_prefix: str, worker: FakeWorker
) -> None:
    async def body(p: AsyncProducer) -> None:
        handle = await p.submit("x", job_id="live")

        def work() -> None:
            job = worker.take()
            worker.token(job, "hi", [1])
            worker.done(job)

        publishing = asyncio.create_task(asyncio.to_thread(work))
        types = [e.type async for e in handle.stream(timeout_s=10)]
        await publishing
        assert types == ["started", "token", "done"]

    run(redis_url, key_prefix, body)
