"""The native API's bodies: a job request as ``build_spec`` takes it, and what the routes return.

Pydantic lives here, at the edge (house rule 5); the job itself is the producer's ``JobSpec``,
validated by the producer, so the gateway accepts exactly what a Python producer may submit.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from producer import JobResult, JobSpec, SamplingSpec
from producer.messages import ToolSpec
from producer.protocol import ChatMessage, Timings, Usage, WireFloat, WireInt
from producer.requests import build_spec
from producer.webhook_spec import WebhookSpec


class JobRequest(BaseModel):
    """Exactly one of ``prompt``, ``messages``, ``prompt_token_ids``. Sampling fields go in
    ``sampling`` or flat beside the others (``{"prompt": "Hi", "max_tokens": 8}``), and so
    does a structure constraint: ``sampling.structure``, or flat one of ``json_schema``,
    ``regex``, ``choice``, ``grammar`` (``Producer.submit``'s keywords)."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={"examples": [{"prompt": "Once upon a time", "max_tokens": 16}]},
    )

    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[ToolSpec] | None = Field(default=None, description="functions messages may call")
    prompt_token_ids: list[WireInt] | None = None
    sampling: SamplingSpec | None = None
    job_id: str | None = Field(
        default=None,
        description="idempotency key: same id, same job (behind auth, the same tenant's job)",
    )
    priority: WireInt | str | None = Field(
        default=None,
        description="-100..100, lower is more urgent; or interactive, default, batch",
    )
    tenant: str | None = Field(default=None, description="ignored when auth is on: the token's")
    deadline_s: WireFloat | None = Field(
        default=None, gt=0, description="not started by then: expired"
    )
    metadata: dict[str, Any] | None = None
    cache_salt: str | None = Field(
        default=None,
        description="only jobs with the same salt share cached prompt blocks (by default the "
        "worker salts by tenant too: tenants never share)",
    )
    webhook: WebhookSpec | None = Field(
        default=None, description="POSTed, signed, when the job ends (docs/webhooks.md)"
    )

    def to_spec(self, tenant: str | None, job_id: str) -> JobSpec:
        """The validated JobSpec, under the job plane's ``job_id`` (``TenantJobs.new_job_id``
        of this body's): InvalidJob, a 422, when it is not one."""
        flat = dict(self.model_extra or {})
        return build_spec(
            self.prompt,
            messages=self.messages,
            prompt_token_ids=self.prompt_token_ids,
            sampling=self.sampling,
            job_id=job_id,
            priority=self.priority,
            tenant=tenant,
            deadline_s=self.deadline_s,
            metadata=self.metadata,
            cache_salt=self.cache_salt,
            tools=self.tools,
            webhook=self.webhook,
            **flat,
        )


class JobCreated(BaseModel):
    job_id: str
    created: bool = Field(description="false: a job with this id existed; nothing was added")


class CancelOutcome(BaseModel):
    job_id: str
    outcome: str = Field(description="cancelled, cancelling, or the terminal state it had")


class ChoiceBody(BaseModel):
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None


class ResultBody(BaseModel):
    """A ``done`` job: choice 0's text and tokens at the top, every choice in ``choices``."""

    job_id: str
    state: str
    text: str
    token_ids: list[int]
    finish_reason: str | None
    choices: list[ChoiceBody]
    usage: Usage | None
    timings: Timings | None

    @classmethod
    def from_result(cls, result: JobResult) -> ResultBody:
        choices = [
            ChoiceBody(
                index=c.choice, text=c.text, token_ids=c.token_ids, finish_reason=c.finish_reason
            )
            for c in result.choices
        ]
        return cls(
            job_id=result.job_id,
            state=str(result.state),
            text=result.text,
            token_ids=result.token_ids,
            finish_reason=result.finish_reason,
            choices=choices,
            usage=result.usage,
            timings=result.timings,
        )
