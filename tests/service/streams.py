"""Checks every job stream must pass, shared by the service tests."""

from __future__ import annotations

from producer.protocol import Event, StartedEvent, TokenEvent, is_terminal


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
