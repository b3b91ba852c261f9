"""Many commands in one round trip on one connection: the publisher's write, without the
per-command bookkeeping of redis-py's pipeline.

redis-py's ``Pipeline`` keeps a stack entry per command, looks up a response callback and parses
each reply through its own layers. The publisher discards every reply but errors, and writes
one command per streamed token, on a thread that holds the GIL the model loop needs. Packed on
the connection (its ``command_packer``, `resp_packer.RespPacker` on the worker's writer) and
sent in one buffer, with each reply read straight off the connection, a ``MULTI``/``EXEC`` of
256 ``XADD`` and the marker ``SET`` took 0.44-0.53 ms of the thread's CPU against 1.03-1.35
through ``Pipeline`` (AMD EPYC Zen 4, Redis 7 on loopback; ``ops/bench/worker_host.py``
measures the worker's whole step).

Errors are redis-py's: a connection or timeout error is raised with the connection dropped
(whether the commands ran is then unknown: the publisher's marker says); a command Redis
refuses raises its `ResponseError` after every reply was read, so the connection stays in step.
In a transaction, a command refused while queueing aborts all of them (``EXECABORT``), as Redis
does; one that fails as it runs (``WRONGTYPE``) does not stop the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import ResponseError

Args = tuple[Any, ...]  # a command: its name, then its arguments, as ``execute_command`` takes


def send_batch(client: redis.Redis, commands: Sequence[Args], transaction: bool) -> None:
    """Run ``commands`` in order in one round trip, inside ``MULTI``/``EXEC`` if
    ``transaction``; raise the first error (see the module's doc)."""
    if not commands:
        return
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        if transaction:
            _run_transaction(conn, commands)
        else:
            _run_pipelined(conn, commands)
    except ResponseError:
        raise  # every reply was read: the connection is in step
    except BaseException:
        conn.disconnect()  # a reply may still be on the wire: never reuse this socket
        raise
    finally:
        pool.release(conn)


def _run_pipelined(conn: Any, commands: Sequence[Args]) -> None:
    conn.send_packed_command(conn.pack_commands(commands))
    first = _read_replies(conn, len(commands))
    if first is not None:
        raise first


def _run_transaction(conn: Any, commands: Sequence[Args]) -> None:
    conn.send_packed_command(conn.pack_commands([("MULTI",), *commands, ("EXEC",)]))
    queued_error = _read_replies(conn, len(commands) + 1)  # MULTI's OK, then QUEUED each
    try:
        replies = conn.read_response()
    except ResponseError:  # EXECABORT: say which command Redis refused
        if queued_error is not None:
            raise queued_error from None
        raise
    for reply in replies or ():
        if isinstance(reply, ResponseError):
            raise reply


def _read_replies(conn: Any, count: int) -> ResponseError | None:
    """Read ``count`` replies; the first error among them, if any."""
    first: ResponseError | None = None
    read = conn.read_response
    for _ in range(count):
        try:
            read()
        except ResponseError as exc:
            if first is None:
                first = exc
    return first
