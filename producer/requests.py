"""What the sync and asyncio clients share: building specs and reading replies, no I/O."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from producer.admission import RETRY_AFTER_S, estimate_cost_tokens
from producer.errors import InvalidJob, JobCancelled, JobExpired, JobFailed, Overloaded
from producer.keys import Keys, band_of
from producer.messages import ToolSpec
from producer.protocol import (
    MAX_PAYLOAD_BYTES,
    CancelledEvent,
    ChatMessage,
    Event,
    JobSpec,
    JobState,
    SamplingSpec,
    UnknownEvent,
    event_fields,
    parse_event,
    parse_priority,
)
from producer.results import JobResult
from producer.structured import structure_of
from producer.webhook_spec import WebhookSpec

DEFAULT_RESULT_TTL_S = 24 * 3600  # Celery's result_expires default: a day
READ_BLOCK_MS = 1000  # one XREAD waits this long before the caller's timeout is checked again
READ_COUNT = 512


def build_spec(
    prompt: str | None = None,
    *,
    messages: Sequence[Mapping[str, Any] | ChatMessage] | None = None,
    prompt_token_ids: Sequence[int] | None = None,
    sampling: SamplingSpec | Mapping[str, Any] | None = None,
    job_id: str | None = None,
    priority: int | str | None = None,
    tenant: str | None = None,
    deadline: float | None = None,
    deadline_s: float | None = None,
    metadata: Mapping[str, Any] | None = None,
    cache_salt: str | None = None,
    tools: Sequence[Mapping[str, Any] | ToolSpec] | None = None,
    json_schema: Any = None,
    regex: str | None = None,
    choice: Sequence[str] | None = None,
    grammar: str | None = None,
    webhook: WebhookSpec | Mapping[str, Any] | str | None = None,
    **sampling_kwargs: Any,
) -> JobSpec:
    """A validated JobSpec from keyword arguments; sampling fields may be given flat
    (``max_tokens=32``) or as ``sampling``. ``deadline_s`` is relative to now. ``priority`` is
    an int or an alias (``protocol.PRIORITY_ALIASES``: interactive, default, batch).
    ``cache_salt``: only jobs with the same salt share cached prompt blocks (``JobSpec``).
    ``tools``: OpenAI function tools, rendered with ``messages`` (``producer.messages``).
    At most one of ``json_schema`` (a dict or a Pydantic model class), ``regex``, ``choice``
    (a list of strings), ``grammar`` (EBNF) constrains the output (``producer.structured``).
    ``webhook``: a WebhookSpec, its fields as a mapping, or just its URL (docs/webhooks.md)."""
    if priority is not None:
        try:
            priority = parse_priority(priority)
        except ValueError as exc:
            raise InvalidJob(f"invalid job: priority: {exc}") from None
    if tools is not None and messages is None:
        raise InvalidJob("invalid job: tools: give messages, which the tools are rendered with")
    structure = structure_of(json_schema=json_schema, regex=regex, choice=choice, grammar=grammar)
    fields: dict[str, Any] = {"sampling": _sampling(sampling, sampling_kwargs, structure)}
    if deadline_s is not None:
        deadline = time.time() + deadline_s
    optional = {
        "id": job_id,
        "prompt": prompt,
        "messages": messages,
        "prompt_token_ids": prompt_token_ids,
        "priority": priority,
        "tenant": tenant,
        "deadline": deadline,
        "metadata": dict(metadata) if metadata is not None else None,
        "cache_salt": cache_salt,
        "tools": tools,
        "webhook": {"url": webhook} if isinstance(webhook, str) else webhook,
    }
    fields.update({k: v for k, v in optional.items() if v is not None})
    try:
        return JobSpec.model_validate(fields)
    except ValidationError as exc:
        raise InvalidJob(validation_message(exc)) from exc


def _sampling(
    sampling: SamplingSpec | Mapping[str, Any] | None,
    flat: Mapping[str, Any],
    structure: dict[str, Any] | None,
) -> dict[str, Any]:
    """The sampling fields: ``sampling``'s, then the flat ones, then the structure keyword's."""
    base = sampling.model_dump() if isinstance(sampling, SamplingSpec) else dict(sampling or {})
    merged = {**base, **flat}
    if structure is not None:
        if merged.get("structure") is not None:
            raise InvalidJob("invalid job: give structure or one of its keywords, not both")
        merged["structure"] = structure
    return merged


def validation_message(exc: ValidationError) -> str:
    """One line naming each bad field (pydantic's own message spans several lines per error)."""
    parts = []
    for e in exc.errors()[:5]:
        where = ".".join(map(str, e["loc"])) or "job"
        parts.append(f"{where}: {e['msg'].removeprefix('Value error, ')}")
    return "invalid job: " + "; ".join(parts)


def submit_keys(keys: Keys, spec: JobSpec) -> list[str]:
    """The ``SUBMIT`` script's KEYS for ``spec`` (see ``scripts.SUBMIT``)."""
    band = band_of(spec.priority)
    return [
        keys.job(spec.id),
        keys.band(band),
        keys.band_load(band),
        keys.tenant_load(spec.tenant),
        keys.limits,
        keys.recent,
    ]


def submit_args(spec: JobSpec) -> list[str]:
    payload = spec.model_dump_json(exclude_none=True)
    if len(payload.encode()) > MAX_PAYLOAD_BYTES:  # every worker would refuse it: say so now
        raise InvalidJob(
            f"invalid job: its payload has {len(payload.encode())} bytes; "
            f"the limit is {MAX_PAYLOAD_BYTES} (protocol.MAX_PAYLOAD_BYTES)"
        )
    band, cost = band_of(spec.priority), estimate_cost_tokens(spec)
    return [spec.id, payload, str(spec.priority), spec.tenant, band, str(cost)]


def submit_created(reply: Sequence[Any]) -> bool:
    """``SUBMIT``'s reply: True when it enqueued the job, False when the id existed; Overloaded
    when a limit refused it."""
    if int(reply[0]) < 0:
        _, scope, kind, current, limit = reply
        raise Overloaded(str(scope), str(kind), int(current), int(limit), RETRY_AFTER_S)
    return bool(int(reply[0]))


def cancel_args(job_id: str, ttl_s: int, prefix: str) -> list[str]:
    return [job_id, str(ttl_s), event_fields(CancelledEvent())["data"], prefix]


def parse_entries(
    entries: Sequence[tuple[str, Mapping[str, str]]],
) -> list[Event | UnknownEvent]:
    return [parse_event(entry_id, dict(fields)) for entry_id, fields in entries]


def read_reply_entries(reply: Any) -> list[tuple[str, Mapping[str, str]]]:
    """XREAD's RESP2 reply for one stream: ``[[key, [(id, fields), ...]]]``, or None."""
    return list(reply[0][1]) if reply else []


def raise_for_outcome(result: JobResult) -> JobResult:
    """Return a ``done`` job's result; raise the matching JobEnded for the other endings."""
    if result.state is JobState.DONE:
        return result
    if result.state is JobState.ERROR:
        raise JobFailed(result.error_code or "error", result.error_message or "", result)
    if result.state is JobState.CANCELLED:
        raise JobCancelled(f"job {result.job_id} was cancelled", result)
    if result.state is JobState.EXPIRED:
        raise JobExpired(f"job {result.job_id} expired: {result.error_message}", result)
    raise AssertionError(f"raise_for_outcome on a job in state {result.state}")


def remaining_ms(deadline: float | None) -> int:
    """How long the next blocking read may wait, given the caller's monotonic deadline: up to
    just past it, so that a read which finds nothing ends after the deadline, not a fraction of a
    millisecond before it (rounding down, and Redis timing blocks on its own millisecond clock,
    left a last 1 ms read that returned nothing before the JobTimeout)."""
    if deadline is None:
        return READ_BLOCK_MS
    return max(1, min(READ_BLOCK_MS, math.ceil((deadline - time.monotonic()) * 1000) + 1))
