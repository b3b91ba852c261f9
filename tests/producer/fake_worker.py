"""A worker without a model: takes jobs with the real CLAIM script and writes the events a real
worker writes (as ``worker/service/intake.py`` and ``jobs.py`` do), one call per event, so a
test decides exactly what a job's stream holds. It reads the bands' streams most urgent first."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis

from producer import scripts
from producer.keys import Keys
from producer.protocol import (
    CancelledEvent,
    DoneEvent,
    ErrorEvent,
    Timings,
    TokenEvent,
    Usage,
    event_fields,
)

TTL_S = 600


@dataclass
class FakeJob:
    job_id: str
    entry_id: str
    outcome: str  # the CLAIM script's: "started", "rejected", "expired" or the state it had
    submitted_at: float
    started_at: float
    stream: str  # the band's jobs stream the entry was read from
    next_index: int = 0
    prompt_tokens: int = 3


class FakeWorker:
    def __init__(self, client: redis.Redis, keys: Keys, name: str = "fake-worker") -> None:
        self.redis = client
        self.keys = keys
        self.name = name
        self._claim = client.register_script(scripts.CLAIM)
        self._stream_of: dict[str, str] = {}  # entry id -> the stream it was read from
        for stream in keys.job_streams:
            try:
                client.xgroup_create(stream, keys.group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def read(self, block_ms: int = 2000) -> tuple[str, dict[str, str]] | None:
        """The next job entry for this consumer, most urgent band first, or None."""
        for stream in self.keys.job_streams:  # without blocking: the first band with an entry
            if got := self._read({stream: ">"}, None):
                return got
        return self._read({s: ">" for s in self.keys.job_streams}, block_ms)

    def _read(self, streams: dict[Any, Any], block_ms: int | None) -> Any:
        reply: Any = self.redis.xreadgroup(
            self.keys.group, self.name, streams, count=1, block=block_ms
        )
        if not reply:
            return None
        stream, [(entry_id, fields), *_] = reply[0]
        self._stream_of[entry_id] = stream
        return entry_id, fields

    def take(self, block_ms: int = 2000) -> FakeJob:
        """Read the next job and claim it to start (it may come back expired or skipped)."""
        got = self.read(block_ms)
        assert got is not None, "no job in the jobs stream"
        entry_id, fields = got
        payload = json.loads(fields["payload"]) if "payload" in fields else {}
        return self.claim(entry_id, fields["id"], "start", payload.get("deadline"))

    def claim(
        self,
        entry_id: str,
        job_id: str,
        action: str = "start",
        deadline: float | None = None,
        error: tuple[str, str] = ("", ""),
    ) -> FakeJob:
        stream = self._stream_of.get(entry_id, self.keys.jobs)
        keys = scripts.claim_keys(self.keys, job_id, stream)
        args = scripts.claim_args(
            self.keys,
            action=scripts.ClaimAction(action),
            worker=self.name,
            entry_id=entry_id,
            ttl_s=TTL_S,
            deadline=deadline,
            error=ErrorEvent(code=error[0], message=error[1]),
        )
        outcome, submitted, now = self._claim(keys=keys, args=args)
        submitted_at = float(submitted) if submitted else float(now)
        return FakeJob(job_id, entry_id, str(outcome), submitted_at, float(now), stream)

    def reject(self, entry_id: str, job_id: str, code: str, message: str) -> FakeJob:
        return self.claim(entry_id, job_id, "reject", error=(code, message))

    def token(self, job: FakeJob, text: str, token_ids: list[int]) -> None:
        event = TokenEvent(index=job.next_index, text=text, token_ids=tuple(token_ids))
        job.next_index += len(token_ids)
        status: dict[str, Any] = {"completion_tokens": job.next_index}
        if event.index == 0:
            status["first_token_at"] = f"{self._now():.6f}"
        self.redis.xadd(self.keys.events(job.job_id), event_fields(event))  # type: ignore[arg-type]
        self.redis.hset(self.keys.job(job.job_id), mapping=status)

    def done(self, job: FakeJob, finish_reason: str = "length") -> None:
        now = self._now()
        timings = Timings(
            queued_s=job.started_at - job.submitted_at, ttft_s=0.01, total_s=now - job.submitted_at
        )
        event = DoneEvent(finish_reason=finish_reason, usage=self._usage(job), timings=timings)  # type: ignore[arg-type]
        self._end(job, event_fields(event), {"state": "done", "finish_reason": finish_reason})

    def fail(self, job: FakeJob, code: str, message: str) -> None:
        fields = event_fields(ErrorEvent(code=code, message=message))
        self._end(job, fields, {"state": "error", "error_code": code, "error_message": message})

    def cancelled(self, job: FakeJob) -> None:
        """The running job's cancel took effect (the worker saw it on the cancels stream)."""
        self._end(job, event_fields(CancelledEvent(usage=self._usage(job))), {"state": "cancelled"})

    def _end(self, job: FakeJob, fields: dict[str, str], status: dict[str, Any]) -> None:
        """Terminal event, final status, TTLs, then XACK and XDEL: the order jobs.py uses."""
        usage = self._usage(job)
        status |= {
            "finished_at": f"{self._now():.6f}",
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
        }
        pipe: Any = self.redis.pipeline(transaction=False)
        pipe.xadd(self.keys.events(job.job_id), fields)
        pipe.hset(self.keys.job(job.job_id), mapping=status)
        pipe.expire(self.keys.job(job.job_id), TTL_S)
        pipe.expire(self.keys.events(job.job_id), TTL_S)
        pipe.xack(job.stream, self.keys.group, job.entry_id)
        pipe.xdel(job.stream, job.entry_id)
        pipe.execute()

    def _usage(self, job: FakeJob) -> Usage:
        n, p = job.next_index, job.prompt_tokens
        return Usage(prompt_tokens=p, completion_tokens=n, total_tokens=p + n)

    def _now(self) -> float:
        sec, micro = self.redis.time()
        return sec + micro / 1e6

    def pending(self) -> int:
        """Entries of the jobs streams delivered to a worker and not yet acknowledged."""
        infos: Any = [self.redis.xpending(s, self.keys.group) for s in self.keys.job_streams]
        return sum(int(info["pending"]) for info in infos)
