"""The wire protocol: job specs the producers write and events the workers publish.

Everything that crosses Redis is one of these pydantic models serialised as JSON. Producers
validate before they enqueue; workers validate again, because a job may come from ``redis-cli``
or another language. ``SCHEMA_VERSION`` changes only when an old worker would misread a job.
"""

from __future__ import annotations

import enum
import json
import uuid
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    field_validator,
    model_validator,
)
from pydantic_core import to_json

from producer.constraints import Structure
from producer.keys import JOB_ID_PATTERN
from producer.logprobs import TokenLogprob as TokenLogprob
from producer.logprobs import TopLogprob as TopLogprob
from producer.messages import ChatMessage as ChatMessage
from producer.messages import Tools

# The states and finish reasons are declared once, in ``producer.status``; JobState is
# re-exported here, where it was declared before.
from producer.status import EntryField, FinishReason
from producer.status import JobState as JobState
from producer.webhook_spec import WebhookSpec
from producer.wire import Frozen
from producer.wire import WireBool as WireBool
from producer.wire import WireFloat as WireFloat
from producer.wire import WireInt as WireInt

SCHEMA_VERSION = 1
SUPPORTED_SCHEMA_VERSIONS = frozenset({1})
# Priority: lower is more urgent (vLLM's and Celery's convention).
MIN_PRIORITY, DEFAULT_PRIORITY, MAX_PRIORITY = -100, 0, 100
# Names for one priority in each band (`keys.band_of`): what a caller means more often than a
# number. The wire carries the int; an alias never reaches Redis.
PRIORITY_ALIASES = {"interactive": -10, "default": 0, "batch": 10}
_ALIAS_NAMES = ", ".join(PRIORITY_ALIASES)
# The cap on ``n`` (SamplingSpec's, so the engine's too): each choice is a sequence of its own
# in the batch, and 16 keeps one request to a quarter of the default 64-sequence batch.
MAX_CHOICES = 16
# logit_bias ids at most (each an add to its row's logit every step); biases and the presence
# and frequency penalties in OpenAI's ranges. A JSON object's keys are strings: "50256" is id 50256.
MAX_LOGIT_BIAS = 1024
LogitBias = dict[Annotated[int, Field(ge=0)], Annotated[WireFloat, Field(ge=-100.0, le=100.0)]]
Penalty = Annotated[WireFloat, Field(ge=-2.0, le=2.0)]
MAX_METADATA_BYTES = 4096  # metadata rides in every job entry: keep it small
# A job entry's payload (the JobSpec JSON) at most: 1 MiB holds a 128k-token prompt (about 4
# bytes a token) twice over; the worker refuses more before it parses, producers before XADD.
MAX_PAYLOAD_BYTES = 1024 * 1024


def parse_priority(value: int | str) -> int:
    """A priority from an int, a decimal string ("-5") or an alias (``PRIORITY_ALIASES``);
    ValueError naming the allowed values otherwise. The range is checked by ``JobSpec``."""
    if isinstance(value, bool):  # bool is an int subclass: True would pass as priority 1
        raise ValueError(f"priority must be an int or one of {_ALIAS_NAMES}, not {value!r}")
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if text.lower() in PRIORITY_ALIASES:
        return PRIORITY_ALIASES[text.lower()]
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"unknown priority {value!r}: give an int {MIN_PRIORITY}..{MAX_PRIORITY} "
            f"(lower is more urgent) or one of {_ALIAS_NAMES}"
        ) from None


class SamplingSpec(Frozen):
    """How a job samples: the one declaration of the sampling names, defaults and ranges. The
    engine's ``SamplingParams`` takes its defaults from here and is checked by this model."""

    max_tokens: WireInt = Field(default=16, ge=1)
    min_tokens: WireInt = Field(default=0, ge=0)
    temperature: WireFloat = Field(default=1.0, ge=0.0)
    top_k: WireInt = Field(default=0, ge=-1)
    top_p: WireFloat = Field(default=1.0, gt=0.0, le=1.0)
    min_p: WireFloat = Field(default=0.0, ge=0.0, le=1.0)
    seed: WireInt | None = None
    ignore_eos: WireBool = False
    stop_token_ids: tuple[WireInt, ...] = ()  # each in the model's vocabulary (worker checks)
    stop: tuple[Annotated[str, Field(min_length=1)], ...] = ()
    include_stop_str_in_output: WireBool = False
    logprobs: WireInt | None = Field(default=None, ge=0, le=20)
    skip_special_tokens: WireBool = True
    n: WireInt = Field(default=1, ge=1, le=MAX_CHOICES)  # choices from one prompt, streamed apart
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repetition_penalty: WireFloat = Field(default=1.0, gt=0.0)  # prompt and output, vLLM's
    logit_bias: LogitBias | None = Field(default=None, max_length=MAX_LOGIT_BIAS)
    structure: Structure | None = None  # what the output must match (producer.constraints)

    @model_validator(mode="after")
    def _min_within_max(self) -> SamplingSpec:
        if self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens must be <= max_tokens")
        return self


class JobSpec(Frozen):
    """One generation job. Give exactly one of ``prompt``, ``messages``, ``prompt_token_ids``."""

    schema_version: WireInt = SCHEMA_VERSION
    id: str = Field(default_factory=lambda: uuid.uuid4().hex, pattern=JOB_ID_PATTERN.pattern)
    prompt: str | None = None
    messages: tuple[ChatMessage, ...] | None = None
    prompt_token_ids: tuple[WireInt, ...] | None = None
    sampling: SamplingSpec = SamplingSpec()
    priority: WireInt = Field(default=DEFAULT_PRIORITY, ge=MIN_PRIORITY, le=MAX_PRIORITY)
    tenant: str = Field(default="default", min_length=1, max_length=64)
    deadline: WireFloat | None = None  # unix time (s); not started by then: the job ends `expired`
    metadata: dict[str, Any] = Field(default_factory=dict)
    # Prefix-cache isolation: only jobs with the same salt share cached prompt blocks, so one
    # tenant cannot hit (or time) another's prefixes. None: the worker's policy decides.
    cache_salt: str | None = Field(default=None, min_length=1, max_length=128)
    webhook: WebhookSpec | None = None  # POSTed when the job ends (the deliverer's docs)
    tools: Tools | None = None  # function tools the messages may call (producer.messages)

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, v: int) -> int:
        if v not in SUPPORTED_SCHEMA_VERSIONS:
            raise ValueError(
                f"unsupported schema_version {v}; supported: {sorted(SUPPORTED_SCHEMA_VERSIONS)}"
            )
        return v

    @field_validator("metadata")
    @classmethod
    def _small_metadata(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            encoded = json.dumps(v, ensure_ascii=False).encode()
        except (TypeError, ValueError) as exc:  # pydantic reports ValueError only, not TypeError
            raise ValueError(f"metadata must be JSON-serialisable: {exc}") from exc
        if len(encoded) > MAX_METADATA_BYTES:
            raise ValueError(f"metadata must serialise to at most {MAX_METADATA_BYTES} bytes")
        return v

    @model_validator(mode="after")
    def _one_prompt(self) -> JobSpec:
        given = [x is not None for x in (self.prompt, self.messages, self.prompt_token_ids)]
        if sum(given) != 1:
            raise ValueError("give exactly one of prompt, messages, prompt_token_ids")
        if self.messages is not None and not self.messages:
            raise ValueError("messages must not be empty")
        return self


class ErrorCode(enum.StrEnum):
    MALFORMED_JSON = "malformed_json"
    UNSUPPORTED_SCHEMA_VERSION = "unsupported_schema_version"
    INVALID_REQUEST = "invalid_request"  # the JobSpec does not validate
    PROMPT_TOO_LONG = "prompt_too_long"  # longer than the model's context
    INVALID_PROMPT = "invalid_prompt"  # empty, or token ids outside the vocabulary
    INTERNAL = "internal"
    # Every worker that ran it died (max deliveries): it went to the dead-letter stream.
    DEAD_LETTER = "dead_letter"


class Usage(Frozen):
    prompt_tokens: int
    completion_tokens: int  # summed over all choices
    total_tokens: int
    cached_prompt_tokens: int = 0  # prompt tokens whose KV came from the prefix cache


class Timings(Frozen):
    """Seconds, all measured on the Redis server's clock from the moment of submission."""

    queued_s: float  # submit -> a worker took the job
    ttft_s: float | None = None  # submit -> first token published (None: no token)
    total_s: float  # submit -> terminal event


class _Event(Frozen):
    # Readers skip what they do not know, so a writer can add a field without breaking a
    # deployed client: unknown fields are dropped when an event is read (docs/protocol.md).
    model_config = ConfigDict(frozen=True, extra="ignore")
    # The Redis stream entry id, filled in when read; the `from_event` to resume after it.
    event_id: str | None = Field(default=None, exclude=True)


class StartedEvent(_Event):
    type: Literal["started"] = "started"
    worker: str
    queued_s: float


class TokenEvent(_Event):
    """``index`` is the position of ``token_ids[0]`` in the completion: 0 for the first event,
    then the previous event's index plus its token count (more than one token per event when the
    worker coalesces with a stream interval)."""

    type: Literal["token"] = "token"
    choice: int = 0  # which of the job's `n` choices; indices count per choice
    index: int
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None = None


def _ends_done(reason: FinishReason) -> FinishReason:
    if not reason.ends_done:
        raise ValueError(f"a done event does not carry {reason.value!r}")
    return reason


# A ``done`` event's reason: the engine's abort and error end a job with another event.
DoneReason = Annotated[FinishReason, AfterValidator(_ends_done)]


class ChoiceEnd(Frozen):
    choice: int
    finish_reason: DoneReason
    completion_tokens: int


class DoneEvent(_Event):
    """The job ended normally. With ``n > 1``, after its last choice: ``finish_reason`` is
    choice 0's and ``choices`` gives each choice's."""

    type: Literal["done"] = "done"
    finish_reason: DoneReason
    usage: Usage
    timings: Timings
    choices: tuple[ChoiceEnd, ...] | None = None


class ErrorEvent(_Event):
    type: Literal["error"] = "error"
    code: str
    message: str


class CancelledEvent(_Event):
    type: Literal["cancelled"] = "cancelled"
    usage: Usage | None = None  # tokens produced before the cancel took effect


class ExpiredEvent(_Event):
    type: Literal["expired"] = "expired"
    message: str


Event = Annotated[
    StartedEvent | TokenEvent | DoneEvent | ErrorEvent | CancelledEvent | ExpiredEvent,
    Field(discriminator="type"),
]
TERMINAL_EVENT_TYPES = frozenset({"done", "error", "cancelled", "expired"})
_EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
EVENT_TYPES = frozenset({"started", "token", *TERMINAL_EVENT_TYPES})
_TOKEN_TYPE: str = TokenEvent.model_fields["type"].default


class UnknownEvent(_Event):
    """An event of a type this reader does not know (a newer worker's): readers skip it, and
    resume after its ``event_id``. No new event type is ever terminal: the six above end jobs."""

    type: str


def event_fields(event: _Event) -> dict[str, str]:
    """The stream entry for an event: ``type`` (for readers who filter) and ``data`` (JSON)."""
    kind = str(getattr(event, "type"))  # noqa: B009  (each subclass declares its own Literal)
    return {EntryField.TYPE: kind, EntryField.DATA: event.model_dump_json(exclude_none=True)}


def token_event_entry(
    choice: int, index: int, text: str, token_ids: Sequence[int]
) -> tuple[str, str, str, str]:
    """``event_fields(TokenEvent(...))`` of a token event without logprobs, flat (field, value,
    field, value) as ``XADD`` takes it: the same characters through the same serializer, with
    no model built. The worker writes one per streamed token: 0.5 us against 2.9 through the
    model (AMD EPYC Zen 4; tests/producer/test_protocol.py holds the two equal)."""
    fields = {
        "type": _TOKEN_TYPE,
        "choice": choice,
        "index": index,
        "text": text,
        "token_ids": token_ids,
    }
    return EntryField.TYPE, _TOKEN_TYPE, EntryField.DATA, to_json(fields).decode()


def parse_event(event_id: str, fields: dict[str, str]) -> Event | UnknownEvent:
    """The event of one stream entry; ``UnknownEvent`` for a type this version does not know."""
    kind = fields.get(EntryField.TYPE)
    if kind is not None and kind not in EVENT_TYPES:
        return UnknownEvent(type=kind, event_id=event_id)
    event = _EVENT_ADAPTER.validate_json(fields[EntryField.DATA])
    return event.model_copy(update={"event_id": event_id})


def is_terminal(event: Event | UnknownEvent) -> bool:
    return event.type in TERMINAL_EVENT_TYPES
