"""The gateway across a Redis outage: streams resume after a restart and end properly, requests
that need Redis while it is away get a 503 in the error shape, and a stream whose outage
outlasts the reconnect bound ends with an error event. Each test has a redis-server of its own
and a gateway on it (no worker: ``OutageWorker`` publishes the job's events)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from gateway.config import GatewayConfig
from ops.bench.redis_server import RedisServer
from producer import Producer, ReconnectPolicy
from producer.protocol import Event, parse_event
from tests.gateway.conftest import Served, parse_sse, serve, stop
from tests.outage import (
    PREFIX,
    READING_S,
    Background,
    OutageWorker,
    check_once_in_order,
    text_of,
)


@pytest.fixture
def outage(own_redis: RedisServer) -> Iterator[OutageWorker]:
    ow = OutageWorker(own_redis)
    yield ow
    ow.close()


@pytest.fixture
def gw(own_redis: RedisServer) -> Iterator[Served]:
    served = serve(GatewayConfig(redis_url=own_redis.url, prefix=PREFIX))
    yield served
    stop(served)


@pytest.fixture
def quick_gw(own_redis: RedisServer) -> Iterator[Served]:
    """A gateway whose streams give up on Redis after 0.3 s."""
    quick = ReconnectPolicy(max_wait_s=0.3, initial_backoff_s=0.02, max_backoff_s=0.1)
    served = serve(GatewayConfig(redis_url=own_redis.url, prefix=PREFIX, reconnect=quick))
    yield served
    stop(served)


def submit(server: RedisServer) -> str:
    with Producer(server.url, prefix=PREFIX) as p:
        return p.submit("outage", max_tokens=16).job_id


def sse_events(gw: Served, job_id: str, restart_after: int, restart: OutageWorker) -> list[Event]:
    """The job's native SSE events; the server restarts after the first ``restart_after``."""
    frames: list[dict[str, str]] = []
    outage: Background | None = None
    with gw.client() as http, http.stream("GET", f"/v1/jobs/{job_id}/events") as response:
        assert response.status_code == 200
        for frame in parse_sse(response.iter_lines()):
            frames.append(frame)
            if len(frames) == restart_after:
                outage = Background(lambda: restart.restart_then_finish(3))
    assert outage is not None
    outage.result()
    return [parse_event(f["id"], {"data": f["data"]}) for f in frames]


def test_sse_survives_a_restart(own_redis: RedisServer, outage: OutageWorker, gw: Served) -> None:
    submit(own_redis)
    job_id = outage.take(3)
    check_once_in_order(sse_events(gw, job_id, 4, outage), 6)


def test_openai_stream_survives_a_restart(outage: OutageWorker, gw: Served) -> None:
    def work() -> None:
        outage.take(2)
        outage.restart_then_finish(3)

    worker = Background(work)
    body = {"prompt": "A", "max_tokens": 16, "stream": True}
    with gw.client() as http, http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        data = [frame["data"] for frame in parse_sse(response.iter_lines())]
    worker.result()
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert not [c for c in chunks if "error" in c]
    assert "".join(c["choices"][0]["text"] for c in chunks) == text_of(5)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/jobs/some-job", None),
        ("GET", "/v1/jobs/some-job/result", None),
        ("POST", "/v1/jobs", {"prompt": "x"}),
        ("POST", "/v1/completions", {"prompt": "x", "stream": True}),
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ],
)
def test_a_request_while_redis_is_away_is_a_503_in_the_error_shape(
    own_redis: RedisServer, gw: Served, method: str, path: str, body: object
) -> None:
    own_redis.stop()
    with gw.client() as http:
        response = http.request(method, path, json=body)
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.headers["Retry-After"] == "1"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code", "param"}
    assert (error["type"], error["code"]) == ("service_unavailable", "redis_unavailable")
    assert "Redis" in error["message"]


def test_past_the_bound_sse_ends_with_a_redis_unavailable_error_event(
    own_redis: RedisServer, outage: OutageWorker, quick_gw: Served
) -> None:
    submit(own_redis)
    job_id = outage.take(2)
    frames: list[dict[str, str]] = []
    with quick_gw.client() as http, http.stream("GET", f"/v1/jobs/{job_id}/events") as response:
        for frame in parse_sse(response.iter_lines()):
            frames.append(frame)
            if len(frames) == 3:  # started and both tokens
                own_redis.stop()
    *events, last = frames
    assert [f["event"] for f in events] == ["started", "token", "token"]
    assert last["event"] == "error" and "id" not in last  # a client resumes after the last id
    error = json.loads(last["data"])
    assert (error["type"], error["code"]) == ("error", "redis_unavailable")
    assert events[-1]["id"] in error["message"] and "127.0.0.1" not in error["message"]


def test_past_the_bound_an_openai_stream_ends_with_an_error_chunk_then_done(
    own_redis: RedisServer, outage: OutageWorker, quick_gw: Served
) -> None:
    def work() -> None:
        outage.take(1)
        time.sleep(READING_S)
        own_redis.stop()

    worker = Background(work)
    body = {"prompt": "A", "max_tokens": 16, "stream": True}
    with quick_gw.client() as http, http.stream("POST", "/v1/completions", json=body) as response:
        data = [frame["data"] for frame in parse_sse(response.iter_lines())]
    worker.result()
    *chunks, error, done = data
    assert [json.loads(c)["choices"][0]["text"] for c in chunks] == [text_of(1)]
    assert done == "[DONE]"
    body = json.loads(error)["error"]
    assert (body["type"], body["code"], body["param"]) == (
        "service_unavailable",
        "redis_unavailable",
        None,
    )
    assert "resume after event" in body["message"]
