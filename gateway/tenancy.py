"""Tenant-scoped job ids: behind auth, each tenant names its jobs in a namespace of its own.

The job plane has one id namespace for everyone. Behind auth the gateway keeps a tenant's job
``order-77`` under the id ``<tag>.order-77``, ``<tag>`` a fixed-length digest of the tenant's
name, and answers with ``order-77`` again. Two tenants' ``order-77`` are then two jobs, and as
every id a tenant can name starts with its own tag (the tag's length is fixed, so where it
ends is too), no id it picks reaches another tenant's job: what it hears about another's id is
what it hears about an id nobody used. Without auth the scope is empty and ids pass as they are.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from producer import AsyncProducer, InvalidJob, JobNotFound, JobResult, JobSpec, JobStatus
from producer.errors import JobEnded, JobTimeout
from producer.keys import MAX_JOB_ID_CHARS, is_valid_job_id

if TYPE_CHECKING:  # auth imports FastAPI; GatewayConfig imports this module, and stays light
    from gateway.auth import Caller

# Hex digits of sha256(tenant) in the tag: 64 bits. Tenants come from the operator's tokens
# file, never from a client, and GatewayConfig refuses two whose tags coincide.
SCOPE_TAG_CHARS = 16
SCOPE_SEPARATOR = "."
# The longest client id behind auth: tag and separator take their share of the protocol's 128.
SCOPED_ID_CHARS = MAX_JOB_ID_CHARS - SCOPE_TAG_CHARS - len(SCOPE_SEPARATOR)


def scope_tag(tenant: str) -> str:
    return hashlib.sha256(tenant.encode()).hexdigest()[:SCOPE_TAG_CHARS]


def check_distinct_tags(tenants: Iterable[str]) -> None:
    """ValueError naming two tenants whose tags coincide: they would share one id namespace."""
    first_of: dict[str, str] = {}
    for tenant in sorted(set(tenants)):
        other = first_of.setdefault(scope_tag(tenant), tenant)
        if other != tenant:
            raise ValueError(f"tenants {other!r} and {tenant!r} share an id scope; rename one")


@dataclass(frozen=True)
class IdScope:
    """One caller's id namespace: ``prefix`` goes before each of its ids ("" without auth)."""

    prefix: str = ""

    @classmethod
    def of(cls, tenant: str | None) -> IdScope:
        return cls() if tenant is None else cls(scope_tag(tenant) + SCOPE_SEPARATOR)

    @property
    def max_id_chars(self) -> int:
        return MAX_JOB_ID_CHARS - len(self.prefix)

    def accepts(self, client_id: str) -> bool:
        """Whether ``client_id`` can name a job here; its internal id then matches
        ``JOB_ID_PATTERN`` (the tag starts with a hex digit and uses the id alphabet)."""
        return is_valid_job_id(client_id) and len(client_id) <= self.max_id_chars

    def internal(self, client_id: str) -> str:
        return self.prefix + client_id

    def owns(self, job_id: str) -> bool:
        return job_id.startswith(self.prefix)

    def external(self, job_id: str) -> str:
        return job_id.removeprefix(self.prefix)


class TenantJobs:
    """The producer's job calls as one caller sees them: its own ids in and out, and a job it
    may not see answered as no job."""

    def __init__(self, producer: AsyncProducer, caller: Caller) -> None:
        self.producer, self.caller = producer, caller
        self.scope = IdScope.of(caller.tenant)

    def job_id(self, client_id: str) -> str:
        """The job plane's id of the caller's ``client_id``; JobNotFound (404) for an id that
        no job of this caller can have."""
        if not self.scope.accepts(client_id):
            raise JobNotFound(client_id)
        return self.scope.internal(client_id)

    def new_job_id(self, client_id: str | None) -> str:
        """The job plane's id for a job submitted as ``client_id`` (a random one when None);
        InvalidJob (422) when the id breaks the rules."""
        client_id = uuid.uuid4().hex if client_id is None else client_id
        if not self.scope.accepts(client_id):
            raise InvalidJob(
                f"invalid job: job_id: 1 to {self.scope.max_id_chars} characters, letters,"
                " digits and . _ : @ -, the first a letter or digit"
            )
        return self.scope.internal(client_id)

    def shown(self, job_id: str) -> str:
        """The id the caller knows a job of the job plane by."""
        return self.scope.external(job_id)

    async def submit(self, spec: JobSpec) -> tuple[str, bool]:
        """Enqueue ``spec`` (its id from ``new_job_id``): the caller's id, and whether it was
        created (False: the caller already had a job with this id)."""
        handle = await self.producer.submit_spec(spec)
        return self.shown(spec.id), handle.created

    async def status(self, client_id: str) -> JobStatus:
        job_id = self.job_id(client_id)
        with _named(job_id, client_id):
            status = await self.producer.status(job_id)
        if not self.caller.may_see(status.tenant):  # a producer wrote it under another tenant
            raise JobNotFound(client_id)
        return status.model_copy(update={"job_id": client_id})

    async def result(self, client_id: str, timeout_s: float) -> JobResult:
        """Wait for the job's end (``AsyncProducer.result``), once the caller may see it."""
        await self.status(client_id)
        job_id = self.job_id(client_id)
        with _named(job_id, client_id):
            result = await self.producer.result(job_id, timeout_s=timeout_s)
        result.job_id = client_id
        return result

    async def cancel(self, client_id: str) -> str:
        await self.status(client_id)
        job_id = self.job_id(client_id)
        with _named(job_id, client_id):
            return await self.producer.cancel(job_id)


@contextmanager
def _named(job_id: str, client_id: str) -> Iterator[None]:
    """The producer's errors, naming the caller's id where they named the job plane's."""
    try:
        yield
    except JobNotFound:
        raise JobNotFound(client_id) from None
    except (JobTimeout, JobEnded) as exc:
        exc.args = tuple(a.replace(job_id, client_id) if isinstance(a, str) else a
                         for a in exc.args)  # fmt: skip
        if isinstance(exc, JobEnded):
            exc.result.job_id = client_id
        raise
