"""`worker/service/resp_packer.py`: the publisher's packer gives redis-py's bytes and errors."""

from __future__ import annotations

import enum

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from redis.connection import Encoder, PythonRespSerializer

from worker.service import resp_packer
from worker.service.build import connect
from worker.service.config import WorkerConfig
from worker.service.publisher import Command, Publisher
from worker.service.resp_packer import RespPacker, packer_kwargs

pytestmark = pytest.mark.skipif(resp_packer.hiredis is None, reason="hiredis not installed")


class Level(enum.IntEnum):
    HIGH = 2


STOCK = PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode).pack
ARGS = st.one_of(
    st.text(alphabet=st.characters(exclude_categories=("Cs",))),
    st.binary(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
)


def packed(packer: object, *args: object) -> bytes:
    return b"".join(bytes(p) for p in packer(*args))  # type: ignore[operator]


@given(st.lists(ARGS, max_size=12))
def test_same_bytes_as_redis_py(args: list[object]) -> None:
    fast = RespPacker(STOCK).pack
    assert packed(fast, "XADD", *args) == packed(STOCK, "XADD", *args)


def test_floats_as_repr_and_large_values_as_redis_py() -> None:
    fast = RespPacker(STOCK).pack
    for value in (0.1, 1e20, 1e-7, -0.0, float("inf"), 1733345678.123456, 5e-324):
        assert packed(fast, "HSET", "k", "f", value) == packed(STOCK, "HSET", "k", "f", value)
        assert f"${len(repr(value))}\r\n{value!r}\r\n".encode() in packed(fast, "SET", "k", value)
    big = "x" * 20_000  # past redis-py's buffer cutoff: the same bytes, in one piece
    assert packed(fast, "SET", "k", big) == packed(STOCK, "SET", "k", big)


def test_refusals_and_split_names_go_to_redis_py() -> None:
    fast = RespPacker(STOCK).pack
    for bad in (True, None, [1]):
        with pytest.raises(redis.DataError):
            fast("SET", "k", bad)
    assert packed(fast, "CONFIG GET", "maxmemory") == packed(STOCK, "CONFIG", "GET", "maxmemory")
    # hiredis refuses an IntEnum; redis-py writes its repr, and still does.
    assert packed(fast, "SET", "k", Level.HIGH) == packed(STOCK, "SET", "k", Level.HIGH)
    with pytest.raises(UnicodeEncodeError):  # as redis-py's strict encoder: nothing is sent
        fast("SET", "k", "\udc80")
    with pytest.raises(ValueError, match="strict UTF-8"):
        packer_kwargs("utf-8", "surrogateescape")


def test_the_publishers_connection_packs_with_it(redis_url: str, key_prefix: str) -> None:
    """Through `build.connect`'s writer and the publisher's MULTI/EXEC: what Redis stores."""
    clients = connect(redis_url, WorkerConfig())
    pool = clients.publisher.connection_pool
    conn = pool.get_connection()
    try:
        assert isinstance(conn._command_packer, RespPacker)
    finally:
        pool.release(conn)
    publisher = Publisher(clients.publisher, 8, f"{key_prefix}:published:w")
    publisher.start()
    stream, job = f"{key_prefix}:s", f"{key_prefix}:job"
    publisher.publish(
        [
            Command("XADD", (stream, "*", "data", '{"text":"caf\u00e9 \u2603"}', "n", 17)),
            Command("HSET", (job, "at", 1733345678.123456, "n", 3)),
        ]
    )
    publisher.close()
    assert publisher.stats.commands == 2 and publisher.stats.retries == 0
    [(_, fields)] = clients.publisher.xrange(stream)
    assert fields == {"data": '{"text":"caf\u00e9 \u2603"}', "n": "17"}
    assert clients.publisher.hgetall(job) == {"at": "1733345678.123456", "n": "3"}
