"""A job inside this worker: what intake hands the model loop, and what the loop tracks.

``ActiveJob`` turns the engine's per-step outputs for one job into the Redis commands of its
events (token events coalesced to the stream interval, per choice, then one terminal event once
every choice has ended), so the model loop itself stays a few lines.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import chain

from producer import scripts
from producer import status as st
from producer.keys import Keys
from producer.protocol import (
    CancelledEvent,
    ChoiceEnd,
    DoneEvent,
    ErrorEvent,
    ExpiredEvent,
    Timings,
    TokenEvent,
    Usage,
    event_fields,
    token_event_entry,
)
from producer.status import FinishReason, JobState, StatusField
from producer.webhook_lua import Hook, webhook_args, webhook_keys
from worker.engine.engine_request import EngineRequest
from worker.engine.outputs import RequestOutput
from worker.engine.sampler import TokenLogprobs
from worker.service.publisher import Command, expire, hset, xack, xadd
from worker.service.token_texts import TokenTexts, wire_logprobs

# Progress goes to the status hash every this many tokens, not at every token event: it
# halves the commands per token (2.8 -> ~1.8 on 16 jobs); the terminal write is exact.
STATUS_EVERY_TOKENS = 16


@dataclass(frozen=True)
class AdmittedJob:
    """A job intake has claimed (``running``, ``started`` published), ready for the engine:
    ``request`` is what the engine runs (its id is the job's; taken over from a worker that
    died, its ``resume`` holds each choice's tokens already streamed)."""

    request: EngineRequest
    entry_id: str  # its entry in the jobs stream: acknowledged after the terminal event
    stream: str  # the jobs stream of its priority band, which holds that entry
    submitted_at: float  # Redis clock, unix s
    started_at: float  # Redis clock, unix s
    clock_offset_s: float  # Redis clock minus this host's time.time(), measured at the claim
    band: str = "default"
    deadline: float | None = None  # unix s (Redis clock); past it the job ends with what it has
    first_token_at: float | None = None  # taken over: when its first token was published
    # Its spec's webhook asks for the terminal event. False: its end skips the WEBHOOK EVAL, 39 us
    # pipelined per job end (docs/webhooks.md); only SUBMIT writes the hash's webhook, from
    # this same spec, so the script would find none. True by default: the script decides.
    terminal_webhook: bool = True

    @property
    def job_id(self) -> str:
        return self.request.request_id


@dataclass
class ChoiceStream:
    """One choice's tokens not yet published, and where its next token event starts."""

    choice: int
    next_index: int = 0
    ended: bool = False
    finish_reason: FinishReason | None = None  # None once ended: the engine aborted it
    ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    texts: TokenTexts | None = None  # names logprob tokens by their text (None: by id only)

    def add(self, out: RequestOutput) -> None:
        self.ids.extend(out.new_token_ids)
        self.text.append(out.text_delta)
        self.logprobs.extend(out.logprobs)
        if out.finished:
            self.ended = True
            reason = None if out.finish_reason is None else FinishReason(out.finish_reason)
            # The engine's abort and error end a job otherwise: a cancel, a deadline, a failure.
            self.finish_reason = reason if reason is not None and reason.ends_done else None

    def take_event(self) -> tuple[str, ...]:
        """The stream entry of a token event of the tokens held, flat (``event_fields``' field,
        value pairs); moves ``next_index`` past them."""
        text = "".join(self.text)
        if self.logprobs:
            logprobs = wire_logprobs(self.logprobs, self.texts)
            ids = tuple(self.ids)
            event = TokenEvent(
                choice=self.choice,
                index=self.next_index,
                text=text,
                token_ids=ids,
                logprobs=logprobs,
            )
            entry = tuple(chain.from_iterable(event_fields(event).items()))
        else:  # a token event's common case: no model built (`token_event_entry`)
            entry = token_event_entry(self.choice, self.next_index, text, self.ids)
        self.next_index += len(self.ids)
        self.ids, self.text, self.logprobs = [], [], []
        return entry


@dataclass
class ActiveJob:
    job: AdmittedJob
    keys: Keys
    stream_interval: int
    result_ttl_s: int
    first_token_at: float | None = None
    num_cached_tokens: int = 0
    choices: list[ChoiceStream] = field(default_factory=list)
    # Why the worker ended it early: FinishReason.DEADLINE (the engine reports it as an abort).
    ending: FinishReason | None = None
    outcome: JobState | None = None  # its final state once the terminal event is built
    num_preemptions: int = 0  # times the engine freed its KV to make room (it resumes)
    finish_reason: FinishReason | None = None
    texts: TokenTexts | None = None  # the worker's, for the logprobs of a job that asks
    # Kept as they change, not summed over the choices at each token: the service loop reads
    # them once per streamed token (`on_output`).
    num_published_tokens: int = field(init=False, default=0)  # over all choices
    _num_running: int = field(init=False, default=0)  # choices the engine has not ended
    _events_key: str = field(init=False, default="")

    def __post_init__(self) -> None:
        n = self.job.request.params.n
        self.choices = [ChoiceStream(i, texts=self.texts) for i in range(n)]
        for choice, tokens in zip(self.choices, self.job.request.resume, strict=False):
            choice.next_index = len(tokens)
        self.num_published_tokens = sum(c.next_index for c in self.choices)
        self._num_running = n
        self._events_key = self.keys.events(self.job.job_id)
        self.first_token_at = self.job.first_token_at

    @property
    def finished(self) -> bool:
        """Every choice ended."""
        return self._num_running == 0

    def now(self) -> float:
        """This host's clock mapped onto Redis', so every timing uses one clock."""
        return time.time() + self.job.clock_offset_s

    def on_output(self, out: RequestOutput) -> list[Command]:
        """The commands for one step's output of one choice: maybe a token event, and the
        terminal event when it was the job's last running choice."""
        choice = self.choices[out.index]
        if out.finished and not choice.ended:
            self._num_running -= 1
        choice.add(out)
        self.num_cached_tokens = max(self.num_cached_tokens, out.num_cached_tokens)
        commands: list[Command] = []
        # A cancel drops unpublished tokens; a deadline publishes what the job produced.
        aborted = out.finished and choice.finish_reason is None and not self.ending
        if choice.ids and not aborted and (len(choice.ids) >= self.stream_interval or out.finished):
            commands += self._token_event(choice)
        if self.finished:
            commands += self._terminal(out.num_prompt_tokens)
        return commands

    def on_preempted(self) -> list[Command]:
        """The engine freed this job's KV; it waits and later resumes where it stopped."""
        self.num_preemptions += 1
        preempted: st.Status = {StatusField.PREEMPTIONS: self.num_preemptions}
        return [hset(self.keys.job(self.job.job_id), preempted)]

    def _token_event(self, choice: ChoiceStream) -> list[Command]:
        before = self.num_published_tokens
        self.num_published_tokens = done = before + len(choice.ids)
        entry = choice.take_event()
        commands = [Command("XADD", (self._events_key, "*", *entry))]
        first = self.first_token_at is None
        if first:
            self.first_token_at = self.now()
        if first or before // STATUS_EVERY_TOKENS != done // STATUS_EVERY_TOKENS:
            status = st.progress(done, self.first_token_at if first else None)
            commands.append(hset(self.keys.job(self.job.job_id), status))
        return commands

    def usage(self, num_prompt_tokens: int) -> Usage:
        n = self.num_published_tokens
        return Usage(
            prompt_tokens=num_prompt_tokens,
            completion_tokens=n,
            total_tokens=num_prompt_tokens + n,
            cached_prompt_tokens=self.num_cached_tokens,
        )

    def _terminal(self, num_prompt_tokens: int) -> list[Command]:
        finished_at = self.now()
        usage = self.usage(num_prompt_tokens)
        counts = st.usage_fields(
            usage.prompt_tokens, usage.completion_tokens, usage.cached_prompt_tokens
        )
        reasons = [c.finish_reason for c in self.choices]
        deadline = self.ending == FinishReason.DEADLINE
        if deadline and self.num_published_tokens == 0:
            return self.expire("deadline passed before the job produced a token")
        if None in reasons and not deadline:  # aborted: a client cancelled it
            status = st.ended(JobState.CANCELLED, finished_at, counts)
            return self.end_commands(event_fields(CancelledEvent(usage=usage)), status)
        # A choice the deadline cut short ends "deadline"; the others keep their own reason.
        ends = [r or FinishReason.DEADLINE for r in reasons]
        submitted = self.job.submitted_at
        ttft = None if self.first_token_at is None else self.first_token_at - submitted
        timings = Timings(
            queued_s=self.job.started_at - submitted, ttft_s=ttft, total_s=finished_at - submitted
        )
        choices = None
        if len(self.choices) > 1:
            choices = tuple(
                ChoiceEnd(choice=c.choice, finish_reason=end, completion_tokens=c.next_index)
                for c, end in zip(self.choices, ends, strict=True)
            )
        done = DoneEvent(finish_reason=ends[0], usage=usage, timings=timings, choices=choices)
        return self.end_commands(event_fields(done), st.done(finished_at, ends[0], counts))

    def fail(self, code: str, message: str) -> list[Command]:
        event = ErrorEvent(code=code, message=message)
        return self.end_commands(event_fields(event), st.failed(self.now(), code, message))

    def expire(self, message: str) -> list[Command]:
        status = st.ended(JobState.EXPIRED, self.now())
        return self.end_commands(event_fields(ExpiredEvent(message=message)), status)

    def cancel(self) -> list[Command]:
        """End a job the engine never saw (cancelled between intake and the model loop)."""
        usage = self.usage(len(self.job.request.prompt_token_ids))
        status = st.ended(JobState.CANCELLED, self.now())
        return self.end_commands(event_fields(CancelledEvent(usage=usage)), status)

    def end_commands(self, fields: Mapping[str, str], status: st.Status) -> list[Command]:
        """Terminal event, final status, its webhook delivery (a job with one), TTLs, then XACK
        and XDEL: in this order, one connection (one MULTI with the publisher's marker)."""
        job_id = self.job.job_id
        if self.num_preemptions:
            status = {**status, StatusField.PREEMPTIONS: self.num_preemptions}
        self.outcome = st.state_of(status)
        reason = status.get(StatusField.FINISH_REASON)
        self.finish_reason = None if reason is None else FinishReason(str(reason))
        webhook = [self._webhook(Hook.TERMINAL)] if self.job.terminal_webhook else []
        return [
            xadd(self.keys.events(job_id), fields),
            hset(self.keys.job(job_id), status),
            *webhook,
            expire(self.keys.job(job_id), self.result_ttl_s),
            expire(self.keys.events(job_id), self.result_ttl_s),
            xack(self.job.stream, self.keys.group, self.job.entry_id),
            # The jobs stream keeps only jobs not yet ended: no trimming can drop a pending one.
            Command("XDEL", (self.job.stream, self.job.entry_id)),
        ]

    def _webhook(self, event: Hook) -> Command:
        """The WEBHOOK script: enqueues the delivery if the job's status hash holds a webhook."""
        keys = webhook_keys(self.keys, self.job.job_id)
        return Command("EVAL", (scripts.WEBHOOK, len(keys), *keys, *webhook_args(self.keys, event)))
