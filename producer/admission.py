"""Admission limits: how much may wait in Redis before ``SUBMIT`` refuses new jobs.

"Queued" means submitted and not yet taken by a worker (state ``queued``). The ``SUBMIT`` script
counts each admitted job in two load hashes, its band's (``Keys.band_load``) and its tenant's
(``Keys.tenant_load``), as ``jobs`` and ``tokens``; ``CANCEL`` and ``CLAIM`` give the counts back
when the job leaves ``queued``. Limits live in one hash (``Keys.limits``), one field per limit:

    band:<band>:jobs      band:<band>:tokens       a band's queue (bands: ``keys.BANDS``)
    tenant:*:jobs         tenant:*:tokens          every tenant without a limit of its own
    tenant:<name>:jobs    tenant:<name>:tokens     one tenant (over all bands)

A missing field is no limit. Checks and counts happen inside the script, so any number of
producers submitting at once never take a scope past its limit. Changing limits takes effect at
the next submit; jobs already queued stay.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import redis

from producer.keys import BANDS, Keys
from producer.protocol import JobSpec

DEFAULT_TENANT = "*"  # the tenant name of the default limits' fields
KINDS = ("jobs", "tokens")
# The producer has no tokenizer. SmolLM2's tokenizer measured 4.2 UTF-8 bytes per token on an
# English sentence but 3.4 on README.md and 2.9 on docs/protocol.md (markup, code): the estimate
# runs low for such text. Each chat message adds template tokens: 5 with SmolLM2's ChatML
# (<|im_start|>, role, newline, <|im_end|>, newline); 4 is the common round figure.
BYTES_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4
# What ``Overloaded.retry_after_s`` says: a queue drains in steps of a worker's batch, which
# takes jobs within about a second when anything finishes; long enough not to spin on Redis.
RETRY_AFTER_S = 1.0


@dataclass(frozen=True)
class Cap:
    """The limits of one scope; None is unlimited."""

    jobs: int | None = None
    tokens: int | None = None

    def items(self) -> list[tuple[str, int]]:
        return [(k, v) for k, v in (("jobs", self.jobs), ("tokens", self.tokens)) if v is not None]


@dataclass(frozen=True)
class Limits:
    """Every admission limit: per band, for tenants by default, and per named tenant (a named
    tenant's limit replaces the default one kind at a time)."""

    bands: Mapping[str, Cap] = field(default_factory=dict)
    tenant_default: Cap = Cap()
    tenants: Mapping[str, Cap] = field(default_factory=dict)

    def to_fields(self) -> dict[str, str]:
        """The limits hash's fields."""
        scopes = [(band_scope(b), cap) for b, cap in self.bands.items()]
        scopes.append((tenant_scope(None), self.tenant_default))
        scopes += [(tenant_scope(t), cap) for t, cap in self.tenants.items()]
        return {limit_field(s, kind): str(v) for s, cap in scopes for kind, v in cap.items()}

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Limits:
        """Parse the limits hash; fields that are not limits (or not integers) are ignored."""
        caps: dict[str, dict[str, int]] = {}
        for name, value in fields.items():
            scope, _, kind = name.rpartition(":")
            if kind in KINDS and value.lstrip("-").isdigit():
                caps.setdefault(scope, {})[kind] = int(value)
        bands = {b: Cap(**caps[band_scope(b)]) for b in BANDS if band_scope(b) in caps}
        tenants = {
            scope.removeprefix("tenant:"): Cap(**cap)
            for scope, cap in caps.items()
            if scope.startswith("tenant:") and scope != tenant_scope(None)
        }
        return cls(bands, Cap(**caps.get(tenant_scope(None), {})), tenants)


def band_scope(band: str) -> str:
    if band not in BANDS:
        raise ValueError(f"unknown band {band!r}; bands: {', '.join(BANDS)}")
    return f"band:{band}"


def tenant_scope(tenant: str | None) -> str:
    """``tenant:<name>``, or ``tenant:*`` (the default) for None."""
    return f"tenant:{DEFAULT_TENANT if tenant is None else tenant}"


def limit_field(scope: str, kind: str) -> str:
    """The limits hash's field for one kind (``KINDS``) of one scope's limit."""
    return f"{scope}:{kind}"


def read_limits(client: redis.Redis, keys: Keys) -> Limits:
    fields: dict[str, str] = client.hgetall(keys.limits)  # type: ignore[assignment]
    return Limits.from_fields(fields)


def write_limits(client: redis.Redis, keys: Keys, limits: Limits) -> None:
    """Replace every limit with ``limits``, in one transaction."""
    pipe = client.pipeline(transaction=True)
    pipe.delete(keys.limits)
    if fields := limits.to_fields():
        pipe.hset(keys.limits, mapping=fields)  # type: ignore[arg-type]
    pipe.execute()


def set_limits(client: redis.Redis, keys: Keys, scope: str, cap: Cap) -> None:
    """Set the limits ``cap`` gives for one scope (``band_scope`` / ``tenant_scope``); a kind
    that is None is left as it was."""
    if fields := {limit_field(scope, kind): str(v) for kind, v in cap.items()}:
        client.hset(keys.limits, mapping=fields)  # type: ignore[arg-type]


def clear_limits(client: redis.Redis, keys: Keys, scope: str | None = None) -> None:
    """Remove one scope's limits, or (``scope`` None) every limit."""
    if scope is None:
        client.delete(keys.limits)
    else:
        client.hdel(keys.limits, *(limit_field(scope, kind) for kind in KINDS))


def read_load(client: redis.Redis, key: str) -> Cap:
    """What a load hash (``Keys.band_load`` / ``Keys.tenant_load``) counts as queued."""
    fields: dict[str, str] = client.hgetall(key)  # type: ignore[assignment]
    return Cap(int(fields.get("jobs", 0)), int(fields.get("tokens", 0)))


def estimate_cost_tokens(spec: JobSpec) -> int:
    """What a job may cost in tokens, for the tokens limits: its prompt plus every token it may
    generate (``max_tokens`` for each of ``n`` choices).

    An estimate: the producer has no tokenizer, so a text prompt counts ``ceil(bytes / 4)`` of
    its UTF-8 (messages: of their contents, plus 4 per message); only ``prompt_token_ids`` is
    exact. Limits are meant for orders of magnitude, not for the last token.
    """
    if spec.prompt_token_ids is not None:
        prompt = len(spec.prompt_token_ids)
    elif spec.messages is not None:
        size = sum(len(m.content.encode()) for m in spec.messages)
        prompt = math.ceil(size / BYTES_PER_TOKEN) + TOKENS_PER_MESSAGE * len(spec.messages)
    else:
        prompt = math.ceil(len((spec.prompt or "").encode()) / BYTES_PER_TOKEN)
    return prompt + spec.sampling.max_tokens * spec.sampling.n
