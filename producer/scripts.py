"""The Lua scripts that make each state change of a job atomic in Redis, and what each is passed.

Submit, cancel and a worker's claim race each other (many producers, many workers); each script
reads the status hash and acts in one step, so a job is enqueued once, cancelled before start
or started, never both. Times come from Redis ``TIME`` so all timings share one clock.

The scripts ship as files, ``producer/lua/<name>.lua`` (package data), so a client in another
language loads the very text the Python side runs. Each file opens with lines generated from
the Python declarations it uses (states, field names, key names, limits: ``declarations``,
written out by ``producer.lua_prelude``), and the Python side regenerates them as it loads a
file (about 3 ms for the four, at import), so what Redis runs always carries the enums' values;
``write_files()`` rewrites the files after a declaration changes (a test fails until it has).
The text is passed to redis-py's ``register_script``, whose calls run ``EVALSHA`` and, on
``NOSCRIPT`` (a restarted or flushed Redis forgot it), load the script again and retry.
"""

from __future__ import annotations

import enum
import functools
from importlib import resources
from pathlib import Path

from producer import lua_prelude, webhook_lua
from producer.admission import (
    BYTES_PER_TOKEN,
    KINDS,
    TOKENS_PER_MESSAGE,
    band_scope,
    limit_field,
    tenant_scope,
)
from producer.keys import (
    BAND_FLOORS,
    BANDS,
    CANCELS_MAXLEN,
    DEAD_LETTER_MAXLEN,
    RECENT_KEPT,
    Keys,
)
from producer.protocol import (
    EVENT_TYPES,
    ChatMessage,
    ErrorEvent,
    ExpiredEvent,
    JobSpec,
    SamplingSpec,
    StartedEvent,
    event_fields,
)
from producer.status import EntryField, JobState, StatusField

SCRIPT_NAMES = ("submit", "cancel", "claim", "reclaim", "webhook", "band_heads")
# RECLAIM's error message names the deliveries with this; the script writes in the count.
DELIVERIES_MARK = "{deliveries}"
# What CLAIM writes when a job's deadline passed before a worker took it.
EXPIRED_AT_CLAIM = "deadline passed before the job started"


class CancelAnswer(enum.StrEnum):
    """CANCEL's answer, unless the job had ended already (then it is the job's state)."""

    CANCELLED = "cancelled"  # it was queued: it ended here
    CANCELLING = "cancelling"  # it runs: its worker stops it within a step
    MISSING = "missing"  # no status hash


class ClaimAction(enum.StrEnum):
    """CLAIM's first argument: what the worker asks of it."""

    START = "start"
    REJECT = "reject"


class ClaimAnswer(enum.StrEnum):
    """CLAIM's answer, unless the job was not queued (then it is the job's state)."""

    STARTED = "started"
    REJECTED = "rejected"
    EXPIRED = "expired"


class ReclaimAnswer(enum.StrEnum):
    """RECLAIM's answer, unless the job had ended already (then it is the job's state)."""

    QUEUED = "queued"  # never started: take it as a new job
    RESUMED = "resumed"  # continue it from its events
    DEAD_LETTER = "dead_letter"  # ended with an error, its entry moved to the dead letters
    OWNED = "owned"  # another worker runs it now


_ANSWERS: dict[str, type[enum.StrEnum]] = {
    "cancel": CancelAnswer,
    "claim": ClaimAnswer,
    "reclaim": ReclaimAnswer,
}


def _members(values: type[enum.StrEnum]) -> dict[str, lua_prelude.LuaValue]:
    return {m.name: m.value for m in values}


def _fields(
    model: type[JobSpec | SamplingSpec | ChatMessage | StartedEvent | ErrorEvent],
) -> dict[str, lua_prelude.LuaValue]:
    """A model's JSON field names, so a script reads a payload or event by the model's names."""
    return {name.upper(): name for name in model.model_fields}


def _default(model: type[JobSpec | SamplingSpec], field: str) -> lua_prelude.LuaValue:
    value = model.model_fields[field].default
    assert isinstance(value, int | str), (model, field)
    return value


def _band_of() -> str:
    """``keys.band_of`` as Lua, from the same floors."""
    rules = [
        f"if priority >= {floor} then return {lua_prelude.literal(band)} end"
        for band, floor in reversed(BAND_FLOORS.items())
    ]
    last = f"return {lua_prelude.literal(BANDS[0])}"
    return lua_prelude.function("band_of", ["priority"], [*rules, last])


@functools.cache
def definitions() -> dict[str, str]:
    """Functions generated from the Python that computes the same, then shared pieces of Lua
    (``lua/shared``, each named by what it defines); a piece may use what comes before it."""
    lp = lua_prelude
    code = {
        "job_key": lp.concat_function("job_key", ["prefix", "id"], lambda p, i: Keys(p).job(i)),
        "band_stream": lp.lookup_function(
            "band_stream",
            ["prefix", "band"],
            {b: (lambda p, b=b: Keys(p).band(b)) for b in BANDS},
        ),
        "band_load_key": lp.concat_function(
            "band_load_key", ["prefix", "band"], lambda p, b: Keys(p).band_load(b)
        ),
        "tenant_load_key": lp.concat_function(
            "tenant_load_key", ["prefix", "tenant"], lambda p, t: Keys(p).tenant_load(t)
        ),
        "limits_key": lp.concat_function("limits_key", ["prefix"], lambda p: Keys(p).limits),
        "recent_key": lp.concat_function("recent_key", ["prefix"], lambda p: Keys(p).recent),
        "band_of": _band_of(),
        "band_scope": lp.lookup_function(
            "band_scope", ["band"], {b: (lambda b=b: band_scope(b)) for b in BANDS}
        ),
        "tenant_scope": lp.concat_function("tenant_scope", ["tenant"], tenant_scope),
        "limit_field": lp.concat_function("limit_field", ["scope", "kind"], limit_field),
    }
    for piece in ("now", "unload", "end_job", "drop_entry"):
        code[piece] = shipped(f"shared/{piece}.lua").strip()
    code.update(webhook_lua.definitions())  # issue 22: the webhooks stream's enqueue
    return code


def declarations(script: str) -> lua_prelude.Names:
    """Everything a script may use; its prelude defines the part its body names."""
    tables: dict[str, dict[str, lua_prelude.LuaValue]] = {
        "State": _members(JobState),
        "Field": _members(StatusField),
        "Entry": _members(EntryField),
        "Event": {kind.upper(): kind for kind in sorted(EVENT_TYPES)},
        "Kind": {kind.upper(): kind for kind in KINDS},  # load-hash fields and limit kinds
        "Action": _members(ClaimAction),
        "JobSpec": _fields(JobSpec),
        "SamplingSpec": _fields(SamplingSpec),
        "ChatMessage": _fields(ChatMessage),
        "StartedEvent": _fields(StartedEvent),
        "ErrorEvent": _fields(ErrorEvent),
    }
    tables.update(webhook_lua.tables())
    if script in _ANSWERS:
        tables["Answer"] = _members(_ANSWERS[script])
    values: dict[str, lua_prelude.LuaValue] = {
        "RECENT_KEPT": RECENT_KEPT,
        "CANCELS_MAXLEN": CANCELS_MAXLEN,
        "DEAD_LETTER_MAXLEN": DEAD_LETTER_MAXLEN,
        "BYTES_PER_TOKEN": BYTES_PER_TOKEN,
        "TOKENS_PER_MESSAGE": TOKENS_PER_MESSAGE,
        "DEFAULT_PRIORITY": _default(JobSpec, "priority"),
        "DEFAULT_TENANT": _default(JobSpec, "tenant"),
        "DEFAULT_MAX_TOKENS": _default(SamplingSpec, "max_tokens"),
        "DEFAULT_N": _default(SamplingSpec, "n"),
        "ANY_TENANT_SCOPE": tenant_scope(None),
        "DELIVERIES_MARK": DELIVERIES_MARK,
        **webhook_lua.values(),
    }
    return lua_prelude.Names(tables, values, definitions())


def shipped(name: str) -> str:
    """The text of a file of ``producer/lua`` as the package holds it."""
    return resources.files("producer").joinpath("lua", name).read_text(encoding="utf-8")


def load(script: str) -> str:
    """A script's text as Redis runs it: its file, with the generated lines regenerated."""
    return lua_prelude.regenerate(shipped(f"{script}.lua"), declarations(script))


SUBMIT = load("submit")
CANCEL = load("cancel")
CLAIM = load("claim")
RECLAIM = load("reclaim")
WEBHOOK = load("webhook")
BAND_HEADS = load("band_heads")  # the band reader's aging: every band's head in one trip


def claim_keys(keys: Keys, job_id: str, stream: str) -> list[str]:
    """CLAIM's KEYS: the job's hash and events, and the jobs stream its entry was read from."""
    return [keys.job(job_id), keys.events(job_id), stream]


def claim_args(
    keys: Keys,
    *,
    action: ClaimAction,
    worker: str,
    entry_id: str,
    ttl_s: int,
    deadline: float | None = None,
    error: ErrorEvent | None = None,
) -> list[str | int]:
    """CLAIM's ARGV: every event it may write is built here, from the protocol's models."""
    data = "" if error is None else event_fields(error)[EntryField.DATA]
    expired = event_fields(ExpiredEvent(message=EXPIRED_AT_CLAIM))[EntryField.DATA]
    # CLAIM sets queued_s on Redis' clock; 0.0 stands in until then.
    started = event_fields(StartedEvent(worker=worker, queued_s=0.0))[EntryField.DATA]
    return [
        action,
        worker,
        "" if deadline is None else repr(deadline),
        ttl_s,
        data,
        expired,
        keys.group,
        entry_id,
        keys.prefix,  # the script derives the admission-load keys from it
        started,
    ]


def write_files() -> list[Path]:
    """Rewrite each ``lua/*.lua`` file whose generated lines are stale; the paths rewritten."""
    written = []
    for script in SCRIPT_NAMES:
        path = Path(__file__).with_name("lua") / f"{script}.lua"
        text = load(script)
        if path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written
