"""Checks every job stream must pass, shared by the service tests."""

from __future__ import annotations

import time

from producer import Producer
from producer.protocol import Event, StartedEvent, TokenEvent, is_terminal


def follow_raw_job(p: Producer, job_id: str, timeout_s: float = 60.0) -> list[Event]:
    """Every event of a job enqueued with a bare XADD (no status hash until a worker claims
    it, so ``stream`` would say it does not exist): wait for its events, then read them all."""
    deadline = time.monotonic() + timeout_s
    while not p.redis.exists(p.keys.events(job_id)):
        assert time.monotonic() < deadline, f"{job_id} never claimed"
        time.sleep(0.01)
    return list(p.stream(job_id, timeout_s=timeout_s))


def check_stream(events: list[Event]) -> list[int]:
    """Assert ``started`` first, token indices contiguous from 0, one terminal event last;
    return the token ids in order."""
    assert events, "no events"
    assert isinstance(events[0], StartedEvent), events[0]
    terminals = [e for e in events if is_terminal(e)]
    assert len(terminals) == 1 and is_terminal(events[-1]), [e.type for e in events]
    ids: list[int] = []
    for event in events[1:-1]:
        assert isinstance(event, TokenEvent), event
        assert event.index == len(ids), (event.index, len(ids))
        assert event.token_ids, "a token event without tokens"
        ids.extend(event.token_ids)
    return ids
