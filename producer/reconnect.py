"""Following a job's events across a Redis outage: a bounded backoff, and a cursor that resumes.

A stream remembers the id of the last event it delivered; after a failed read it waits, then
reads again from that id (``XREAD`` returns only entries after it), so a restart of Redis or a
dropped connection delays events but never repeats or skips one. Redis with ``appendonly yes``
keeps the events over a restart. No I/O here: both clients step a stream with the one flow
``flows.next_events``, which reads, and after a failure sleeps, as this cursor says.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from producer import requests as rq
from producer.errors import JobTimeout, RedisUnavailable
from producer.protocol import Event, UnknownEvent, is_terminal

# What a restart or a dropped connection raises: refused connects, "Connection closed by
# server", socket timeouts, and LOADING while a restarted Redis replays its append-only file
# (BusyLoadingError is a ConnectionError).
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError)


@dataclass(frozen=True)
class ReconnectPolicy:
    """How long a stream keeps trying to reach Redis once it fails, and how often.

    One outage may last ``max_wait_s`` from the first failed read; past that the stream raises
    ``RedisUnavailable`` (0: at the first failure). Retries start ``initial_backoff_s`` apart
    and double up to ``max_backoff_s``, each with up to half of it taken off at random, so the
    many streams of a gateway do not all reconnect in the same millisecond.
    """

    # The outages this is for, a restart or a failover, last seconds (a test's restart with its
    # append-only file: well under one); after 30 s the caller should hear of it.
    max_wait_s: float = 30.0
    initial_backoff_s: float = 0.05
    # Once Redis is back, a stream resumes within this much; 2 s of lag after a long outage,
    # in exchange for one connect attempt per stream per 2 s while it lasts.
    max_backoff_s: float = 2.0

    def __post_init__(self) -> None:
        if self.max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, not {self.max_wait_s}")
        if not 0 < self.initial_backoff_s <= self.max_backoff_s:
            raise ValueError(
                f"need 0 < initial_backoff_s ({self.initial_backoff_s}) <= max_backoff_s "
                f"({self.max_backoff_s})"
            )

    def backoff_s(self, failures: int) -> float:
        """The wait before retry number ``failures`` (1 after the first failure), jitter off."""
        doublings = min(failures - 1, 32)  # an hour-long wait counts ~1,800 failures: 2**1799
        return min(self.max_backoff_s, self.initial_backoff_s * 2.0**doublings)


DEFAULT_RECONNECT = ReconnectPolicy()


class EventCursor:
    """Where one stream of a job's events is: the last event id it delivered, whether it
    reached the terminal event, the caller's deadline, and the outage it is in, if any.

    ``check_job`` is True for the first read and after each failure: the client then checks
    that the job still exists, so a Redis that came back empty (persistence off) answers
    JobNotFound instead of a stream that waits for ever.
    """

    def __init__(
        self, job_id: str, from_event: str, timeout_s: float | None, policy: ReconnectPolicy
    ) -> None:
        self.job_id = job_id
        self.from_event = from_event
        self.timeout_s = timeout_s
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.policy = policy
        self.finished = False
        self.check_job = True
        self.failures = 0
        self.outage_since: float | None = None

    def block_ms(self) -> int:
        """How long the next ``XREAD`` may wait."""
        return rq.remaining_ms(self.deadline)

    def accept(self, batch: Sequence[Event | UnknownEvent]) -> list[Event]:
        """A successful read: the events to deliver, up to the terminal one; ends any outage.
        Events of unknown types are read past and not delivered."""
        self.check_job, self.failures, self.outage_since = False, 0, None
        delivered: list[Event] = []
        for event in batch:
            self.from_event = event.event_id or self.from_event
            if isinstance(event, UnknownEvent):
                continue
            delivered.append(event)
            if is_terminal(event):
                self.finished = True
                break
        return delivered

    def failed(self, exc: Exception) -> float:
        """A failed read: seconds to wait before the next, or RedisUnavailable once the outage
        has lasted the policy's ``max_wait_s``."""
        now = time.monotonic()
        if self.outage_since is None:
            self.outage_since = now
        self.failures += 1
        self.check_job = True
        give_up_at = self.outage_since + self.policy.max_wait_s
        if now >= give_up_at:
            waited_s = now - self.outage_since
            raise RedisUnavailable(
                f"Redis unreachable for {waited_s:.1f} s, past the reconnect bound of"
                f" {self.policy.max_wait_s:g} s, following job {self.job_id} (resume after"
                f" event {self.from_event}): {exc}",
                job_id=self.job_id,
                last_event_id=self.from_event,
                waited_s=waited_s,
            ) from exc
        delay = self.policy.backoff_s(self.failures) * random.uniform(0.5, 1.0)
        if self.deadline is not None:  # wake for the deadline: it is a JobTimeout, as ever
            give_up_at = min(give_up_at, self.deadline)
        return max(0.0, min(delay, give_up_at - now))

    def check_deadline(self) -> None:
        """JobTimeout once the caller's ``timeout_s`` has passed without the terminal event."""
        if self.finished or self.deadline is None or time.monotonic() < self.deadline:
            return
        down = "" if self.outage_since is None else " (Redis unreachable meanwhile)"
        raise JobTimeout(f"job {self.job_id} not finished within {self.timeout_s} s{down}")
