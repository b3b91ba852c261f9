"""What ``Producer`` and ``AsyncProducer`` do, written once: each operation as a flow of Redis
calls (``producer.calls``) from the spec or id it is given to the result it returns. The two
clients differ only in how they run a flow (``calls.drive`` / ``calls.adrive``).
"""

from __future__ import annotations

from typing import Any

from producer import requests as rq
from producer import waiting
from producer.calls import Command, Flow, Pipeline, Script, Sleep
from producer.errors import JobNotFound
from producer.keys import Keys, band_of
from producer.protocol import Event, JobSpec, JobState, UnknownEvent
from producer.reconnect import TRANSIENT_ERRORS, EventCursor
from producer.results import JobStatus
from producer.scripts import CANCEL, SUBMIT, CancelAnswer

# The scripts each client registers, by the name a ``Script`` call gives.
SCRIPTS = {"submit": SUBMIT, "cancel": CANCEL}


def submit(keys: Keys, spec: JobSpec) -> Flow[bool]:
    """``SUBMIT``: True when it enqueued the job, False when the id existed; Overloaded when an
    admission limit refused it."""
    reply = yield Script("submit", rq.submit_keys(keys, spec), rq.submit_args(spec))
    return rq.submit_created(reply)


def status(keys: Keys, job_id: str) -> Flow[JobStatus]:
    """The job's status hash; for a queued job also ``wait_reason`` and ``position``."""
    fields: dict[str, str] = yield Command("hgetall", (keys.job(job_id),))
    if not fields:
        raise JobNotFound(job_id)
    found = JobStatus.from_hash(job_id, fields)
    if found.state is not JobState.QUEUED or "stream_id" not in fields:
        return found
    band = found.band or band_of(found.priority or 0)  # no band: submitted by hand
    wait = yield from waiting_of(keys, band, fields["stream_id"])
    return found.model_copy(update={"wait_reason": wait.wait_reason, "position": wait.position})


def waiting_of(keys: Keys, band: str, stream_id: str) -> Flow[waiting.Waiting]:
    """Why a queued job waits and its position (``producer.waiting``): two round trips."""
    replies = yield Pipeline(lambda pipe: waiting.ask_fleet(pipe, keys), raise_on_error=False)
    names, queues = waiting.read_fleet(replies, keys)
    replies = yield Pipeline(
        lambda pipe: waiting.ask_position(pipe, keys, names, band, queues[band], stream_id),
        raise_on_error=False,
    )
    return waiting.waiting(replies, names, band, queues)


def cancel(keys: Keys, job_id: str, result_ttl_s: int) -> Flow[str]:
    """``CANCEL``: "cancelled", "cancelling" or the terminal state the job already had;
    JobNotFound when it has no status hash."""
    script_keys = [keys.job(job_id), keys.events(job_id), keys.cancels]
    reply = yield Script("cancel", script_keys, rq.cancel_args(job_id, result_ttl_s, keys.prefix))
    if str(reply) == CancelAnswer.MISSING:
        raise JobNotFound(job_id)
    return str(reply)


def events(
    keys: Keys, job_id: str, from_event: str, block_ms: int | None
) -> Flow[list[Event | UnknownEvent]]:
    """One ``XREAD`` of the events after ``from_event``, waiting up to ``block_ms``."""
    read = {keys.events(job_id): from_event}
    reply: Any = yield Command("xread", (read,), {"count": rq.READ_COUNT, "block": block_ms})
    return rq.parse_entries(rq.read_reply_entries(reply))


def next_events(keys: Keys, cursor: EventCursor) -> Flow[list[Event]]:
    """One step of a stream (``Producer.next_events``): a read after the cursor, or after a
    failed one its backoff and no events."""
    job_keys = keys.job(cursor.job_id), keys.events(cursor.job_id)
    try:
        if cursor.check_job and not (yield Command("exists", job_keys)):
            raise JobNotFound(cursor.job_id)
        batch = yield from events(keys, cursor.job_id, cursor.from_event, cursor.block_ms())
    except TRANSIENT_ERRORS as exc:
        yield Sleep(cursor.failed(exc))
        return []
    return cursor.accept(batch)
