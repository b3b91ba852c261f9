"""The flows both clients run (``producer.calls``, ``producer.flows``, ``fleet``'s readers):
one operation, the same result on the sync and the asyncio driver."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

from producer import JobTimeout, Keys, Producer, fleet
from producer import requests as rq
from producer.calls import IO, Command, Flow, Pipeline, Sleep, adrive, async_io, drive
from producer.protocol import Event


class FlakyClient:
    """Answers ``get`` with a connection error the first time, then with ``"v"``."""

    def __init__(self) -> None:
        self.calls = 0

    def get(self, key: str) -> str:
        self.calls += 1
        if self.calls == 1:
            raise redis.ConnectionError("gone")
        return "v"


class AsyncFlakyClient(FlakyClient):
    async def get(self, key: str) -> str:  # type: ignore[override]
        return FlakyClient.get(self, key)


def retry_once() -> Flow[tuple[str, str]]:
    """A read that fails is seen where the flow yielded it, as an exception it can catch."""
    try:
        value = yield Command("get", ("k",))
    except redis.ConnectionError as exc:
        yield Sleep(0.01)
        value = yield Command("get", ("k",))
        return str(exc), value
    return "no error", value


def test_a_failed_call_is_thrown_into_the_flow_on_both_drivers() -> None:
    slept: list[float] = []
    sync = drive(retry_once(), IO(FlakyClient(), sleep=slept.append))
    assert sync == ("gone", "v") and slept == [0.01]

    async def run() -> tuple[str, str]:
        return await adrive(retry_once(), async_io(AsyncFlakyClient()))

    assert asyncio.run(run()) == sync


def test_an_error_the_flow_does_not_catch_reaches_the_caller() -> None:
    def reads_once() -> Flow[Any]:
        return (yield Command("get", ("k",)))

    with pytest.raises(redis.ConnectionError, match="gone"):
        drive(reads_once(), IO(FlakyClient()))


def test_queue_depths_is_one_round_trip_read_by_the_groups_rule() -> None:
    keys = Keys("t")
    flow = fleet.queue_depths_flow(keys)
    call = next(flow)
    assert isinstance(call, Pipeline) and not call.raise_on_error
    group = {"name": keys.group, "lag": 2, "last-delivered-id": "1-0"}
    no_stream = redis.ResponseError("no such key")
    replies = [no_stream, 0, [group], 7, [{"name": "other", "lag": 9}], 4]
    with pytest.raises(StopIteration) as done:
        flow.send(replies)
    # interactive: no stream; default: the group's lag, not XLEN; batch: no group of ours.
    assert done.value.value == {"interactive": 0, "default": 2, "batch": 4}


def test_batches_gives_each_read_even_an_empty_one(producer: Producer) -> None:
    producer.submit("x", job_id="quiet")
    batches = producer.batches("quiet", timeout_s=0.2)
    assert next(batches) == []  # no worker: the read found nothing before the timeout
    more: list[list[Event]] = []
    with pytest.raises(JobTimeout):
        for _ in range(3):
            more.append(next(batches))
    # The read blocks until just past the deadline (`remaining_ms`). A Redis whose clock ends the
    # block over a millisecond early may leave one more empty read; never an event, never a third.
    assert more in ([], [[]])


def test_a_read_blocks_until_past_the_callers_deadline() -> None:
    deadline = time.monotonic() + 0.2004
    assert 201 <= rq.remaining_ms(deadline) <= 202  # rounded up, plus a millisecond
    assert rq.remaining_ms(time.monotonic() - 5) == 1  # past: one short read, then JobTimeout
    assert rq.remaining_ms(None) == rq.READ_BLOCK_MS
