"""What the clients return: a job's status (from its hash) and its result (from its events)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from producer.protocol import (
    CancelledEvent,
    DoneEvent,
    ErrorEvent,
    Event,
    ExpiredEvent,
    FinishReason,
    JobState,
    StartedEvent,
    Timings,
    TokenEvent,
    UnknownEvent,
    Usage,
)
from producer.status import StatusField


class JobStatus(BaseModel):
    """The job's status hash, typed. Times are unix seconds on the Redis server's clock."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    state: JobState
    submitted_at: float | None = None
    started_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    worker: str | None = None
    priority: int | None = None
    tenant: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    finish_reason: FinishReason | None = None
    error_code: str | None = None
    error_message: str | None = None
    cancel_requested: bool = False
    band: str | None = None  # the priority band whose stream holds it (set by SUBMIT)
    cost_tokens: int | None = None  # what admission counted for it (admission.estimate_...)
    # Why it has not started yet, and how many jobs are ahead of it. For a queued job in Redis
    # the client computes them at each status() (see ``producer.waiting``); a worker writes
    # them (and ``preemptions``, how often it was preempted) for jobs it holds.
    wait_reason: str | None = None
    position: int | None = None
    preemptions: int | None = None

    @classmethod
    def from_hash(cls, job_id: str, fields: Mapping[str, str]) -> JobStatus:
        """Typed from the hash's fields (``status.StatusField``); the others are left out."""
        known = {k: v for k, v in fields.items() if k in cls.model_fields and v != ""}
        known.pop("job_id", None)
        if StatusField.CANCEL_REQUESTED in known:
            known[StatusField.CANCEL_REQUESTED] = str(known[StatusField.CANCEL_REQUESTED] == "1")
        return cls.model_validate({"job_id": job_id, **known})


@dataclass
class ChoiceResult:
    """One of a job's ``n`` choices: its text and tokens, in order, duplicates dropped."""

    choice: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None

    def add(self, event: TokenEvent) -> None:
        # An event whose tokens we already have is a repeat (a worker's write retried after a
        # lost connection): skip it, so the text never doubles.
        if event.index < len(self.token_ids):
            return
        self.text += event.text
        self.token_ids.extend(event.token_ids)


@dataclass
class JobResult:
    """A job's outcome, assembled from its events. ``text`` and ``token_ids`` are choice 0's
    (the only one unless the job asked for ``n > 1``); ``choices`` holds every choice."""

    job_id: str
    state: JobState = JobState.RUNNING
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    worker: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    choices: list[ChoiceResult] = field(default_factory=lambda: [ChoiceResult(0)])

    @property
    def text(self) -> str:
        return self.choices[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.choices[0].token_ids

    @classmethod
    def from_events(cls, job_id: str, events: Iterable[Event]) -> JobResult:
        result = cls(job_id)
        for event in events:
            result.apply(event)
        return result

    def choice(self, index: int) -> ChoiceResult:
        while len(self.choices) <= index:
            self.choices.append(ChoiceResult(len(self.choices)))
        return self.choices[index]

    def apply(self, event: Event | UnknownEvent) -> None:
        """Take one event into the result; an event of an unknown type changes nothing."""
        if isinstance(event, StartedEvent):
            self.worker = event.worker
        elif isinstance(event, TokenEvent):
            self.choice(event.choice).add(event)
        elif isinstance(event, DoneEvent):
            self.state, self.finish_reason = JobState.DONE, event.finish_reason
            self.usage, self.timings = event.usage, event.timings
            self.choices[0].finish_reason = event.finish_reason
            for end in event.choices or ():
                self.choice(end.choice).finish_reason = end.finish_reason
        elif isinstance(event, ErrorEvent):
            self.state, self.error_code = JobState.ERROR, event.code
            self.error_message = event.message
        elif isinstance(event, CancelledEvent):
            self.state, self.usage = JobState.CANCELLED, event.usage
        elif isinstance(event, ExpiredEvent):
            self.state, self.error_message = JobState.EXPIRED, event.message
