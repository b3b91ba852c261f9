"""A job's life as Redis records it: its states, how it finished, and the names of its fields.

The one declaration of each: the Python side writes with these, and the Lua scripts get them
generated into their text (``producer.lua_prelude``), so ``"running"`` is spelt once, here.
This module imports nothing of the protocol's models, so ``protocol`` can build on it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

# A status hash's values as the writers pass them to HSET.
Status = dict[str, str | int | float]


class JobState(enum.StrEnum):
    """The ``state`` field of a job's status hash."""

    QUEUED = "queued"  # in the jobs stream, not yet taken by a worker
    RUNNING = "running"  # a worker took it and published `started`
    DONE = "done"  # finished normally (`done` event)
    ERROR = "error"  # rejected or failed (`error` event)
    CANCELLED = "cancelled"  # a client cancelled it (`cancelled` event)
    EXPIRED = "expired"  # its deadline passed before it started (`expired` event)

    @property
    def terminal(self) -> bool:
        return self not in (JobState.QUEUED, JobState.RUNNING)


class FinishReason(enum.StrEnum):
    """Why a choice stopped, one type from the engine to the stream: the engine's sequences,
    its outputs, ``done.finish_reason`` and the hash's field. A ``done`` event carries only the
    reasons that ``ends_done``; the engine's others end a job otherwise (cancelled, error)."""

    STOP = "stop"  # EOS or a stop token id
    LENGTH = "length"  # max_tokens, or the model's context
    STOP_STRING = "stop_string"  # one of the job's stop strings
    DEADLINE = "deadline"  # its deadline passed while it ran; it ended with what it had made
    ABORT = "abort"  # the engine's: aborted (a cancel, a deadline, a worker handing jobs back)
    ERROR = "error"  # the engine's: it failed inside a step; the job ends with an error event

    @property
    def ends_done(self) -> bool:
        """Whether a ``done`` event may carry it (the wire's finish reasons)."""
        return self not in (FinishReason.ABORT, FinishReason.ERROR)


class StatusField(enum.StrEnum):
    """The fields of a job's status hash (``Keys.job``), all strings in Redis."""

    STATE = "state"  # a JobState
    SUBMITTED_AT = "submitted_at"  # times: unix s as "sec.micro" (`stamp`), Redis' clock
    PRIORITY = "priority"
    TENANT = "tenant"
    STREAM_ID = "stream_id"  # its entry in its band's jobs stream
    BAND = "band"
    COST_TOKENS = "cost_tokens"  # what admission counted (admission.estimate_cost_tokens)
    STARTED_AT = "started_at"
    WORKER = "worker"  # the worker that runs (or ran, or ended) it
    DELIVERIES = "deliveries"  # workers that took it; past --max-deliveries: dead letter
    ENTRY_ID = "entry_id"  # the entry its worker claimed (a retried claim finds itself)
    HANDOFF = "handoff"  # "1": its worker stopped and handed it back (not a failed delivery)
    RESUMED_AT = "resumed_at"
    FIRST_TOKEN_AT = "first_token_at"
    COMPLETION_TOKENS = "completion_tokens"  # every few tokens while it runs, exact at the end
    PROMPT_TOKENS = "prompt_tokens"
    CACHED_PROMPT_TOKENS = "cached_prompt_tokens"
    FINISHED_AT = "finished_at"
    FINISH_REASON = "finish_reason"  # a FinishReason
    ERROR_CODE = "error_code"
    ERROR_MESSAGE = "error_message"
    CANCEL_REQUESTED = "cancel_requested"  # "1": a client asked to cancel it while it ran
    WAIT_REASON = "wait_reason"  # a worker holds it but has not scheduled it: why
    POSITION = "position"
    PREEMPTIONS = "preemptions"
    # The JobSpec's webhook as JSON, copied by SUBMIT: what the scripts that end (or start) a
    # job read to enqueue its delivery (``producer.webhook_lua``). JobStatus leaves it out.
    WEBHOOK = "webhook"


class EntryField(enum.StrEnum):
    """The fields of the stream entries the protocol writes."""

    ID = "id"  # jobs, cancels and dead-letter entries: the job id
    PAYLOAD = "payload"  # jobs and dead-letter entries: the JobSpec JSON as submitted
    TYPE = "type"  # events: the event's type, for readers that filter without parsing
    DATA = "data"  # events: the event as JSON
    ENTRY_ID = "entry_id"  # dead letter: the entry's id in its jobs stream
    DELIVERIES = "deliveries"  # dead letter: how many workers took it
    WORKER = "worker"  # dead letter: the last worker that held it
    REASON = "reason"  # dead letter of an entry with no valid id: "invalid_id"


def stamp(unix_s: float) -> str:
    """A time as the status hash holds it: "sec.micro", six digits, as the scripts write TIME."""
    return f"{unix_s:.6f}"


def progress(completion_tokens: int, first_token_at: float | None = None) -> Status:
    """A running job's progress; ``first_token_at`` with its first token event."""
    status: Status = {StatusField.COMPLETION_TOKENS: completion_tokens}
    if first_token_at is not None:
        status[StatusField.FIRST_TOKEN_AT] = stamp(first_token_at)
    return status


def usage_fields(prompt: int, completion: int, cached_prompt: int) -> Status:
    """The token counts a job that ran ends with (done, or cancelled while running)."""
    return {
        StatusField.PROMPT_TOKENS: prompt,
        StatusField.COMPLETION_TOKENS: completion,
        StatusField.CACHED_PROMPT_TOKENS: cached_prompt,
    }


def ended(state: JobState, finished_at: float, fields: Status | None = None) -> Status:
    """The final status of a job that ends ``state`` at ``finished_at`` (unix s)."""
    assert state.terminal, state
    return {StatusField.FINISHED_AT: stamp(finished_at), **(fields or {}), StatusField.STATE: state}


def done(finished_at: float, reason: FinishReason, counts: Status) -> Status:
    return ended(JobState.DONE, finished_at, {**counts, StatusField.FINISH_REASON: reason})


def failed(finished_at: float, code: str, message: str) -> Status:
    fields: Status = {StatusField.ERROR_CODE: code, StatusField.ERROR_MESSAGE: message}
    return ended(JobState.ERROR, finished_at, fields)


def state_of(status: Mapping[str, str | int | float]) -> JobState | None:
    """The state a status update sets, if it sets one."""
    state = status.get(StatusField.STATE)
    return None if state is None else JobState(str(state))
