"""Producer streams across a Redis restart: every event once, in order, then the terminal one;
past the reconnect bound, ``RedisUnavailable``. Each test restarts a redis-server of its own."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from ops.bench.redis_server import RedisServer
from producer import (
    AsyncProducer,
    JobNotFound,
    JobTimeout,
    PaternosterError,
    Producer,
    ReconnectPolicy,
    RedisUnavailable,
)
from producer.protocol import Event, parse_event
from tests.outage import PREFIX, READING_S, Background, OutageWorker, check_once_in_order, text_of
from worker.cli import main

# Several backoff steps inside the bound, and the bound tests well under a second.
QUICK = ReconnectPolicy(max_wait_s=0.3, initial_backoff_s=0.02, max_backoff_s=0.1)


@pytest.fixture
def outage(own_redis: RedisServer) -> Iterator[OutageWorker]:
    ow = OutageWorker(own_redis)
    yield ow
    ow.close()


def submit(server: RedisServer) -> str:
    with Producer(server.url, prefix=PREFIX) as p:
        return p.submit("outage", max_tokens=16).job_id


def test_sync_stream_survives_a_restart(own_redis: RedisServer, outage: OutageWorker) -> None:
    submit(own_redis)
    job_id = outage.take(3)
    with Producer(own_redis.url, prefix=PREFIX) as p:
        events = p.stream(job_id)
        seen = [next(events) for _ in range(4)]  # started and the three tokens before
        restart = Background(lambda: outage.restart_then_finish(3))
        seen += list(events)
        restart.result()
    check_once_in_order(seen, 6)


def test_sync_result_survives_a_restart(own_redis: RedisServer, outage: OutageWorker) -> None:
    submit(own_redis)
    job_id = outage.take(2)
    restart = Background(lambda: outage.restart_then_finish(2))
    with Producer(own_redis.url, prefix=PREFIX) as p:
        result = p.result(job_id, timeout_s=20)
    restart.result()
    assert result.text == text_of(4) and result.token_ids == [0, 1, 2, 3]


def test_async_stream_survives_a_restart(own_redis: RedisServer, outage: OutageWorker) -> None:
    submit(own_redis)
    job_id = outage.take(3)

    async def follow() -> list[Event]:
        async with AsyncProducer(own_redis.url, prefix=PREFIX) as p:
            seen: list[Event] = []
            restart: Background | None = None
            async for event in p.stream(job_id):
                seen.append(event)
                if len(seen) == 4:  # started and the three tokens before
                    restart = Background(lambda: outage.restart_then_finish(3))
            assert restart is not None
            restart.result()
            return seen

    check_once_in_order(asyncio.run(follow()), 6)


def test_cli_stream_survives_a_restart(
    own_redis: RedisServer, outage: OutageWorker, capsys: pytest.CaptureFixture[str]
) -> None:
    submit(own_redis)
    job_id = outage.take(2)
    restart = Background(lambda: outage.restart_then_finish(3))
    rc = main(["stream", job_id, "--json", "--redis-url", own_redis.url, "--prefix", PREFIX])
    restart.result()
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines: list[dict[str, Any]] = [json.loads(line) for line in out.splitlines()]
    events = [parse_event(line.pop("event_id"), {"data": json.dumps(line)}) for line in lines]
    check_once_in_order(events, 5)


def test_cli_result_survives_a_restart(
    own_redis: RedisServer, outage: OutageWorker, capsys: pytest.CaptureFixture[str]
) -> None:
    submit(own_redis)
    job_id = outage.take(1)
    restart = Background(lambda: outage.restart_then_finish(2))
    rc = main(["result", job_id, "--redis-url", own_redis.url, "--prefix", PREFIX])
    restart.result()
    out, err = capsys.readouterr()
    assert (rc, out) == (0, text_of(3) + "\n"), err


def test_a_deadline_during_an_outage_is_still_a_job_timeout(own_redis: RedisServer) -> None:
    job_id = submit(own_redis)
    with Producer(own_redis.url, prefix=PREFIX) as p:
        own_redis.stop()
        started = time.monotonic()
        with pytest.raises(JobTimeout):
            p.result(job_id, timeout_s=0.5)
        assert time.monotonic() - started < 3


def test_past_the_bound_the_sync_stream_raises_redis_unavailable(
    own_redis: RedisServer, outage: OutageWorker
) -> None:
    submit(own_redis)
    job_id = outage.take(1)
    with Producer(own_redis.url, prefix=PREFIX, reconnect=QUICK) as p:
        events = p.stream(job_id)
        started_event, token = next(events), next(events)
        own_redis.stop()
        started = time.monotonic()
        with pytest.raises(RedisUnavailable, match=r"reconnect bound of 0\.3 s") as info:
            next(events)
        assert 0.3 <= time.monotonic() - started < 2
    assert (started_event.type, token.type) == ("started", "token")
    error = info.value
    assert (error.job_id, error.last_event_id) == (job_id, token.event_id)  # where to resume
    assert error.waited_s >= 0.3
    # Callers that caught redis-py's error before (the CLI's "cannot reach Redis") still do.
    assert isinstance(error, PaternosterError)
    assert isinstance(error, redis.ConnectionError)
    assert isinstance(error.__cause__, redis.ConnectionError)


def test_past_the_bound_the_async_result_raises_redis_unavailable(own_redis: RedisServer) -> None:
    job_id = submit(own_redis)

    async def wait() -> None:
        async with AsyncProducer(own_redis.url, prefix=PREFIX, reconnect=QUICK) as p:
            own_redis.stop()
            await p.result(job_id)

    with pytest.raises(RedisUnavailable):
        asyncio.run(wait())


def test_cli_past_the_bound_exits_1_naming_redis(
    own_redis: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = submit(own_redis)
    own_redis.stop()
    args = ["--redis-url", own_redis.url, "--prefix", PREFIX, "--reconnect-s", "0.2"]
    assert main(["stream", job_id, *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("paternoster stream: error: cannot reach Redis") and "0.2 s" in err


def test_a_redis_that_came_back_empty_is_job_not_found(
    own_redis: RedisServer, outage: OutageWorker
) -> None:
    """Persistence lost, say: the stream notices at its reconnect instead of waiting for ever."""
    submit(own_redis)
    job_id = outage.take(1)

    def restart_empty() -> None:
        time.sleep(READING_S)
        own_redis.stop()
        for path in own_redis.directory.glob("appendonly*"):  # a file or a directory
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        own_redis.start()

    with Producer(own_redis.url, prefix=PREFIX) as p:
        events = p.stream(job_id, timeout_s=10)
        assert [next(events).type, next(events).type] == ["started", "token"]
        restart = Background(restart_empty)
        with pytest.raises(JobNotFound):
            next(events)
        restart.result()


def test_policy_backoff_doubles_to_its_cap_and_bad_values_are_refused() -> None:
    policy = ReconnectPolicy(initial_backoff_s=0.1, max_backoff_s=0.5)
    assert [policy.backoff_s(n) for n in range(1, 6)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert policy.backoff_s(5000) == 0.5  # a long outage's count does not overflow a float
    for bad in ({"max_wait_s": -1}, {"initial_backoff_s": 0}, {"max_backoff_s": 0.01}):
        with pytest.raises(ValueError):
            ReconnectPolicy(**bad)  # type: ignore[arg-type]
