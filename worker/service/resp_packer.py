"""The publisher's command packer: one call into hiredis per command, not a Python loop per
argument.

Every token a worker streams is one ``XADD`` of about a dozen arguments, packed into Redis's
wire format on the publisher thread, which holds the GIL the model loop needs to schedule and
launch the next step. redis-py packs each argument in Python (its encoder's type checks, then a
bytes format); its own hiredis packer still runs that encoder per argument first. Handing the
whole argument tuple to ``hiredis.pack_command`` (which takes str, bytes, int and float, and
writes floats as ``repr`` does, as redis-py's encoder) packs the same bytes:
256 pipelined ``XADD`` in one ``MULTI``/``EXEC`` took 1.06-1.16 ms of the thread's CPU against
2.93-4.76 with redis-py's packer (AMD EPYC, 2 cores, loaded by a compile beside it;
``ops/bench/worker_host.py`` measures the worker's whole step).

Anything hiredis refuses (a bool, None, an IntEnum, another type) and a command name with a
space in it (``"CONFIG GET"``, which redis-py splits) go to redis-py's packer, so its errors
(`DataError`), its encoding of those and its splitting stay as they were.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:
    import hiredis
except ImportError:  # an optional speed-up: without it redis-py packs as it always did
    hiredis = None  # type: ignore[assignment]

from redis.connection import Encoder, PythonRespSerializer

# redis-py's default for a connection's packer: larger arguments are sent as their own chunks.
_BUFFER_CUTOFF = 6000


class RespPacker:
    """A redis-py ``command_packer``: ``pack(*args)`` returns the command's wire bytes."""

    def __init__(self, fallback: Callable[..., list[bytes]]) -> None:
        self._fallback = fallback

    def pack(self, *args: Any) -> list[Any]:
        name = args[0]
        if (" " if isinstance(name, str) else b" ") in name:  # "CONFIG GET": redis-py splits it
            return self._fallback(*args)
        try:
            return [hiredis.pack_command(args)]
        except TypeError:  # a type hiredis does not pack: redis-py's rules (and errors)
            return self._fallback(*args)


def packer_kwargs(encoding: str = "utf-8", encoding_errors: str = "strict") -> dict[str, Any]:
    """``redis.Redis`` keyword arguments that give its connections a `RespPacker` (none
    without hiredis). Only for a client that encodes str as strict UTF-8, as hiredis does."""
    if hiredis is None:
        return {}
    if (encoding, encoding_errors) != ("utf-8", "strict"):
        raise ValueError("hiredis packs str as strict UTF-8")
    fallback = PythonRespSerializer(
        _BUFFER_CUTOFF, Encoder(encoding, encoding_errors, False).encode
    )
    return {"command_packer": RespPacker(fallback.pack)}
