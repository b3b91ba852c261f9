"""The publisher's batched write: order, transactions, Redis's errors, a lost connection."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from worker.service.redis_batch import send_batch
from worker.service.resp_packer import packer_kwargs


@pytest.fixture(params=["stock", "resp_packer"])
def writer(request: pytest.FixtureRequest, redis_url: str) -> redis.Redis:
    """A writer as tests build it, and as `build.connect` builds the worker's."""
    kwargs = packer_kwargs() if request.param == "resp_packer" else {}
    return redis.Redis.from_url(redis_url, decode_responses=True, **kwargs)


@pytest.mark.parametrize("transaction", [True, False])
def test_commands_run_in_order(writer: redis.Redis, key_prefix: str, transaction: bool) -> None:
    stream, job = f"{key_prefix}:s", f"{key_prefix}:job"
    batch: list[tuple[Any, ...]] = [
        ("XADD", stream, "*", "n", i, "text", "caf\u00e9") for i in range(300)
    ]
    batch += [("HSET", job, "at", 1.5, "n", 3), ("EXPIRE", job, 60)]
    send_batch(writer, batch, transaction)
    entries = writer.xrange(stream)
    assert [f["n"] for _, f in entries] == [str(i) for i in range(300)]
    assert entries[0][1]["text"] == "caf\u00e9"
    assert writer.hgetall(job) == {"at": "1.5", "n": "3"}
    assert 0 < writer.ttl(job) <= 60
    send_batch(writer, [], transaction)  # nothing to send: no round trip, no error


@pytest.mark.parametrize("transaction", [True, False])
def test_a_command_failing_as_it_runs_raises_and_the_rest_ran(
    writer: redis.Redis, key_prefix: str, transaction: bool
) -> None:
    """WRONGTYPE fails at EXEC, not while queued: Redis runs the others, as in redis-py."""
    text, stream = f"{key_prefix}:text", f"{key_prefix}:s"
    writer.set(text, "not a stream")
    keys = [(stream, 1), (text, 2), (stream, 3)]
    batch = [("XADD", key, "*", "n", n) for key, n in keys]
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        send_batch(writer, batch, transaction)
    assert [f["n"] for _, f in writer.xrange(stream)] == ["1", "3"]
    assert writer.ping()  # the connection read every reply: the next command gets its own


def test_a_command_refused_while_queued_aborts_the_transaction(
    writer: redis.Redis, key_prefix: str
) -> None:
    """A wrong number of arguments is refused at once: EXEC then runs nothing (EXECABORT);
    the error raised is the refused command's."""
    stream = f"{key_prefix}:s"
    batch = [("XADD", stream, "*", "n", 1), ("EXPIRE", stream), ("XADD", stream, "*", "n", 2)]
    with pytest.raises(redis.ResponseError, match="wrong number of arguments") as raised:
        send_batch(writer, batch, transaction=True)
    assert not isinstance(raised.value, redis.exceptions.ExecAbortError)
    assert writer.exists(stream) == 0
    send_batch(writer, [("XADD", stream, "*", "n", 3)], transaction=True)
    assert [f["n"] for _, f in writer.xrange(stream)] == ["3"]


def test_a_lost_connection_is_dropped_not_reused(
    writer: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply lost mid-batch leaves the others on the socket: the connection is closed, so
    the next batch reads its own replies, not the old ones."""
    pool = writer.connection_pool
    conn = pool.get_connection()
    pool.release(conn)
    real = type(conn).read_response
    calls: list[int] = []

    def read_then_drop(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Only this connection's reads count: the patch is on the class, and a thread an
        # earlier test left running (a worker's intake loop) once took the second read in CI,
        # so the batch's own never raised (2026-12-07).
        if self is conn:
            calls.append(1)
            if len(calls) == 2:  # MULTI's OK read, then the connection goes
                raise redis.ConnectionError("connection reset")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(conn), "read_response", read_then_drop)
    stream = f"{key_prefix}:s"
    with pytest.raises(redis.ConnectionError):
        send_batch(writer, [("XADD", stream, "*", "n", 1), ("XADD", stream, "*", "n", 2)], True)
    assert conn._sock is None  # disconnected, and back in the pool
    monkeypatch.undo()
    send_batch(writer, [("SET", f"{key_prefix}:k", "v")], transaction=True)
    assert writer.get(f"{key_prefix}:k") == "v"
    assert writer.xlen(stream) == 2  # Redis ran the transaction: only its reply was lost
