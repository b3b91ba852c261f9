"""A delivery's body, built from what Redis holds of the job: its status hash and events.

The body is the same bytes for every attempt and every deliverer (nothing in it is taken at
delivery time), so a receiver that deduplicates by ``webhook-id`` may also compare bodies.
Shape, after Standard Webhooks' recommendation: ``{"type", "timestamp", "data"}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from producer.protocol import JobState, parse_event
from producer.results import JobResult
from producer.status import StatusField

STARTED = "started"


class JobGone(Exception):
    """The job's status hash or events expired (or were never there): nothing to deliver."""


def _iso(unix_s: str | None) -> str:
    seconds = float(unix_s or 0.0)
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def _ended(job_id: str, status: Mapping[str, str], result: JobResult) -> dict[str, Any]:
    data: dict[str, Any] = {
        "job_id": job_id,
        "state": result.state.value,
        "finish_reason": None if result.finish_reason is None else result.finish_reason.value,
        "text": result.text,
        "usage": None if result.usage is None else result.usage.model_dump(),
        "timings": None if result.timings is None else result.timings.model_dump(),
    }
    if len(result.choices) > 1:
        data["choices"] = [
            {
                "index": c.choice,
                "text": c.text,
                "finish_reason": None if c.finish_reason is None else c.finish_reason.value,
            }
            for c in result.choices
        ]
    if result.state is JobState.ERROR or result.state is JobState.EXPIRED:
        data["error"] = {"code": result.error_code, "message": result.error_message}
    data["worker"] = status.get(StatusField.WORKER)
    return data


def body(
    job_id: str,
    event: str,
    status: Mapping[str, str],
    entries: Sequence[tuple[str, Mapping[str, str]]],
) -> bytes:
    """The JSON body for ``event`` ("terminal" or "started") of a job, from its status hash
    and its events stream's entries; JobGone when they do not hold that event."""
    if not status:
        raise JobGone(f"job {job_id}: its status hash is gone (past its result TTL?)")
    events = [parse_event(eid, dict(fields)) for eid, fields in entries]
    if event == STARTED:
        data = {
            "job_id": job_id,
            "state": JobState.RUNNING.value,
            "worker": status.get(StatusField.WORKER),
        }
        payload = {"type": "job.started", "timestamp": _iso(status.get(StatusField.STARTED_AT))}
        return json.dumps({**payload, "data": data}, ensure_ascii=False).encode()
    result = JobResult(job_id)
    for e in events:
        result.apply(e)  # an event of a type this version does not know changes nothing
    if not result.state.terminal:
        raise JobGone(f"job {job_id}: its events hold no terminal event")
    stamp = _iso(status.get(StatusField.FINISHED_AT))
    payload = {"type": f"job.{result.state.value}", "timestamp": stamp}
    data = _ended(job_id, status, result)
    return json.dumps({**payload, "data": data}, ensure_ascii=False).encode()
