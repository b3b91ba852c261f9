"""Redis calls as values, so each client operation is written once for both clients.

An operation is a generator (a ``Flow``) that yields the calls it needs, one round trip each,
and is sent back each reply, or has the call's exception thrown in at its ``yield`` (so it
handles a failed read with an ordinary ``try``); what it returns is the operation's result.
It does no I/O itself: ``drive`` runs it on a redis-py client, ``adrive`` on a
``redis.asyncio`` one. Each call's ``issue`` starts it on the client it is given: the reply
itself on a sync client, an awaitable of it on an asyncio one, since both clients spell every
command, pipeline and script call alike.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class IO:
    """What a flow's calls run on: a client, its registered scripts by name, and a sleep
    (``time.sleep`` or ``asyncio.sleep``, matching the client)."""

    client: Any
    scripts: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    sleep: Callable[[float], Any] = time.sleep


@dataclass(frozen=True)
class Command:
    """One command, by its redis-py method name."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def issue(self, io: IO) -> Any:
        return getattr(io.client, self.name)(*self.args, **self.kwargs)


@dataclass(frozen=True)
class Pipeline:
    """Commands in one round trip, no transaction: ``fill`` queues them on the pipeline; the
    reply is their replies in order (with ``raise_on_error`` False, an error is a reply too)."""

    fill: Callable[[Any], object]
    raise_on_error: bool = True

    def issue(self, io: IO) -> Any:
        pipe = io.client.pipeline(transaction=False)
        self.fill(pipe)
        return pipe.execute(raise_on_error=self.raise_on_error)


@dataclass(frozen=True)
class Script:
    """A script the client registered (``IO.scripts``), with its KEYS and ARGV."""

    name: str
    keys: list[str]
    args: list[Any]

    def issue(self, io: IO) -> Any:
        return io.scripts[self.name](keys=self.keys, args=self.args)


@dataclass(frozen=True)
class Sleep:
    """Wait, without Redis (a backoff between reads); the reply is None."""

    seconds: float

    def issue(self, io: IO) -> Any:
        return io.sleep(self.seconds)


Call = Command | Pipeline | Script | Sleep
Flow = Generator[Call, Any, T]


class Runner:
    """Steps one flow: ``next_call`` resumes it with the last reply (or error) and says what
    it asks next, or None once it returned (its result is then ``value``)."""

    def __init__(self, flow: Flow[T]) -> None:
        self._flow = flow
        self._reply: Any = None
        self._error: Exception | None = None
        self.value: Any = None

    def next_call(self) -> Call | None:
        error, self._error = self._error, None
        try:
            return self._flow.send(self._reply) if error is None else self._flow.throw(error)
        except StopIteration as stop:
            self.value = stop.value
            return None

    def replied(self, reply: Any) -> None:
        self._reply = reply

    def failed(self, error: Exception) -> None:
        self._error = error


def drive(flow: Flow[T], io: IO) -> T:
    """Run ``flow`` on a redis-py client; what it returns, or what it raises."""
    runner = Runner(flow)
    while (call := runner.next_call()) is not None:
        try:
            runner.replied(call.issue(io))
        except Exception as exc:  # the flow decides: it sees the error where it yielded
            runner.failed(exc)
    result: T = runner.value
    return result


async def adrive(flow: Flow[T], io: IO) -> T:
    """``drive`` on a ``redis.asyncio`` client (and ``asyncio.sleep``)."""
    runner = Runner(flow)
    while (call := runner.next_call()) is not None:
        try:
            runner.replied(await call.issue(io))
        except Exception as exc:
            runner.failed(exc)
    result: T = runner.value
    return result


def async_io(client: Any, scripts: Mapping[str, Callable[..., Any]] | None = None) -> IO:
    return IO(client, scripts or {}, asyncio.sleep)
