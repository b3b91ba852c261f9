"""One batch in progress: submit its lines as jobs, a window at a time, and collect their ends.

Everything that must survive a gateway is in Redis: the batch's ``submitted`` cursor and one
field per finished line in its output or error hash (HSETNX, so a line is written once however
often its result is read). ``Progress.resume`` rebuilds the rest from them: the lines (the
input file parsed again, deterministically: job ids are ``<batch id>-<line index>``, the
deadline is the batch's ``expires_at``) and the jobs in flight (submitted, without a line yet).
Submitting one again is harmless: ``SUBMIT`` answers an existing id with "exists".

Admission: a job an admission limit refuses (``Overloaded``) stays unsubmitted and is tried
again at the next poll, so a batch is admitted as capacity frees, never refused as a whole.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from gateway.batch_lines import BatchLine, error_line, not_run_line, refused_line, result_line
from gateway.errors import ApiError
from gateway.metrics import GatewayMetrics
from gateway.openai_stream import Shape
from gateway.tenancy import IdScope
from producer import AsyncProducer, InvalidJob, JobNotFound, JobResult
from producer.errors import JobEnded, JobTimeout, Overloaded
from producer.keys import Keys
from producer.protocol import JobState

RESULT_READ_S = 10.0
# Results read at once when collecting: each read holds a pooled connection, and a window on
# a large fleet can see hundreds of jobs end in one poll.
RESULT_READS_AT_ONCE = 32  # reading a finished job's events: they are all there already
# What an in-flight line says when its job vanished from Redis (lost with its data).
JOB_LOST = "job_lost"


def request_id(batch_id: str, index: int) -> str:
    """The id a line's job has in its tenant's namespace (the response's ``request_id``)."""
    return f"{batch_id}-{index}"


@dataclass
class Progress:
    batch_id: str
    scope: IdScope
    chat: bool
    model_name: str  # the response's model when the line's body names none
    lines: list[BatchLine]
    submitted: int = 0  # lines[:submitted] were submitted (or refused)
    in_flight: dict[int, BatchLine] = field(default_factory=dict)
    cancels_sent: bool = False

    def job_id(self, index: int) -> str:
        return self.scope.internal(request_id(self.batch_id, index))

    @property
    def drained(self) -> bool:
        return self.submitted >= len(self.lines) and not self.in_flight


class Driver:
    """The Redis side of a ``Progress``: the calls that move it on."""

    def __init__(self, producer: AsyncProducer, metrics: GatewayMetrics) -> None:
        self.producer, self.metrics = producer, metrics
        self.redis: Any = producer.redis  # decoding redis.asyncio: replies are str
        self.keys: Keys = producer.keys

    async def record(self, progress: Progress, index: int, ok: bool, line: str) -> None:
        key = self.keys.batch_output if ok else self.keys.batch_errors
        await self.redis.hsetnx(key(progress.batch_id), str(index), line)

    async def resume(self, progress: Progress, submitted: int) -> None:
        """Refused lines into the error hash; the in-flight set from what has no line yet."""
        errors = self.keys.batch_errors(progress.batch_id)
        pipe = self.redis.pipeline(transaction=False)
        for line in progress.lines:
            if line.error is not None:
                text = refused_line(line, None)
                pipe.hsetnx(errors, str(line.index), text)
        pipe.hkeys(self.keys.batch_output(progress.batch_id))
        pipe.hkeys(errors)
        replies = await pipe.execute()
        done = {int(k) for k in replies[-1]} | {int(k) for k in replies[-2]}
        progress.submitted = min(submitted, len(progress.lines))
        progress.in_flight = {
            line.index: line for line in progress.lines[: progress.submitted]
            if line.spec is not None and line.index not in done
        }  # fmt: skip

    async def submit_more(self, progress: Progress, window: int) -> None:
        """Submit lines in order while fewer than ``window`` are in flight."""
        start = progress.submitted
        while len(progress.in_flight) < window and progress.submitted < len(progress.lines):
            line = progress.lines[progress.submitted]
            if line.spec is not None:
                try:
                    await self.producer.submit_spec(line.spec)
                except Overloaded:
                    break  # admitted as capacity frees: the next poll tries again
                except InvalidJob as exc:  # e.g. a payload over the protocol's limit
                    error = ApiError(422, str(exc), code="invalid_job")
                    refused = BatchLine(line.index, line.custom_id, error=error)
                    await self.record(progress, line.index, False, refused_line(refused, None))
                    self.metrics.lines("refused")
                else:
                    progress.in_flight[line.index] = line
                    self.metrics.lines("submitted")
            progress.submitted += 1
        if progress.submitted != start:
            await self.redis.hset(self.keys.batch(progress.batch_id), "submitted",
                                  str(progress.submitted))  # fmt: skip

    async def drop_unsubmitted(self, progress: Progress, code: str) -> None:
        """Lines not yet submitted become error lines ``code`` (the batch stops)."""
        pipe = self.redis.pipeline(transaction=False)
        for line in progress.lines[progress.submitted :]:
            if line.spec is not None:
                pipe.hsetnx(self.keys.batch_errors(progress.batch_id), str(line.index),
                            not_run_line(line, code))  # fmt: skip
        pipe.hset(self.keys.batch(progress.batch_id), "submitted", str(len(progress.lines)))
        await pipe.execute()
        progress.submitted = len(progress.lines)

    async def cancel_in_flight(self, progress: Progress) -> None:
        if progress.cancels_sent:
            return
        for index in list(progress.in_flight):
            try:
                await self.producer.cancel(progress.job_id(index))
            except JobNotFound:
                continue
        progress.cancels_sent = True

    async def collect(self, progress: Progress, cancelled_code: str) -> None:
        """Lines for the in-flight jobs that ended; ``cancelled_code`` for a cancelled one.
        The ended jobs' results are read concurrently (each is a round trip or two), so the
        window refills after the slowest read, not after their sum."""
        indices = list(progress.in_flight)
        pipe = self.redis.pipeline(transaction=False)
        for index in indices:
            pipe.hget(self.keys.job(progress.job_id(index)), "state")
        states = await pipe.execute()
        ended_now = {i: state is None for i, state in zip(indices, states, strict=True)
                if state is None or JobState(state).terminal}  # fmt: skip
        pending = list(ended_now.items())
        got: list[tuple[bool, str] | None] = []
        for start in range(0, len(pending), RESULT_READS_AT_ONCE):
            chunk = pending[start : start + RESULT_READS_AT_ONCE]
            got += await asyncio.gather(
                *(self._line(progress, i, lost, cancelled_code) for i, lost in chunk)
            )
        for index, ended in zip(ended_now, got, strict=True):
            if ended is None:
                continue  # its events are slow to read: the next poll
            await self.record(progress, index, *ended)
            del progress.in_flight[index]
            self.metrics.lines("completed" if ended[0] else "failed")

    async def _line(
        self, progress: Progress, index: int, gone: bool, cancelled_code: str
    ) -> tuple[bool, str] | None:
        line = progress.in_flight[index]
        if gone:
            return False, _lost(line)
        try:
            return await self._ended(progress, line, cancelled_code)
        except JobTimeout:
            return None

    async def _ended(
        self, progress: Progress, line: BatchLine, cancelled_code: str
    ) -> tuple[bool, str]:
        job_id = progress.job_id(line.index)
        ended: JobEnded | None = None
        try:
            result = await self.producer.result(job_id, timeout_s=RESULT_READ_S)
        except JobEnded as exc:
            result, ended = exc.result, exc
        except JobNotFound:
            return False, _lost(line)
        shown = request_id(progress.batch_id, line.index)
        result = _shown(result, shown)
        shape = Shape(shown, line.model or progress.model_name, progress.chat)
        return result_line(line, result, shown, shape, ended, cancelled_code)


def _shown(result: JobResult, shown: str) -> JobResult:
    result.job_id = shown  # as the route's answers: the id in the caller's namespace
    return result


def _lost(line: BatchLine) -> str:
    return error_line(line, JOB_LOST, "the request's job is gone from Redis before it ended")
