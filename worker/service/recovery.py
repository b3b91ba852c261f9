"""Taking over the jobs of workers that died: find them, claim them, and rebuild where they were.

A job stays pending in the consumer group under the worker that took it until that worker acks
it after the terminal event. When that worker's lease lapses (``lease.py``), any other worker's
intake finds its pending entries (``XPENDING``), moves them to itself (``XCLAIM`` with a minimum
idle time, so of two workers racing for one entry only the first gets it) and runs ``RECLAIM``
(``Reclaimer``), which either resumes the job, sends it to the dead-letter stream after too many
deliveries, or says it had already ended. A resumed job (``Resumer``) takes its tokens from its
own result stream: the new worker continues from the next index, so a reader sees one
contiguous stream.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import redis
import structlog

from producer import scripts
from producer.keys import Keys
from producer.protocol import ErrorCode, ErrorEvent, TokenEvent, event_fields, parse_event
from worker.service.handover import Handover
from worker.service.job_parsing import PromptLimits, parse_job

log = structlog.get_logger("paternoster.recovery")
RECLAIM_EVERY_S = 2.0
# A lease seen missing is trusted only after this long: a worker that was cut off from Redis
# for a moment renews within a second of coming back, and must not lose its jobs meanwhile.
LEASE_GRACE_S = 3.0
# XCLAIM's min idle time: the first of two racing workers resets the entry's idle time, so the
# second's XCLAIM returns nothing.
MIN_IDLE_MS = 1000
DEFAULT_MAX_DELIVERIES = 3
# An entry pending under this worker's own name that it does not hold, delivered this long
# ago: its XREADGROUP or CLAIM reply was lost. At start every such entry is from an earlier life.
STRANDED_S = 30.0


class ReclaimOutcome(enum.StrEnum):
    """What ``RECLAIM`` did with a dead worker's entry, now this worker's: its answer
    (``scripts.ReclaimAnswer``), or ``ENDED`` when it answered the job's terminal state."""

    RESUMED = scripts.ReclaimAnswer.RESUMED  # it was running: continue it from its tokens
    QUEUED = scripts.ReclaimAnswer.QUEUED  # its worker never started it: take it as new
    DEAD_LETTER = scripts.ReclaimAnswer.DEAD_LETTER  # past max deliveries: in the dead letters
    OWNED = scripts.ReclaimAnswer.OWNED  # another worker resumed it: the entry goes back there
    ENDED = "ended"  # it had ended (its worker died after the terminal event, before the ack)

    @classmethod
    def of(cls, answer: str) -> ReclaimOutcome:
        """RECLAIM's answer; a terminal state (``done``, ``error``, ...) is ``ENDED``."""
        try:
            return cls(answer)
        except ValueError:
            return cls.ENDED


@dataclass(frozen=True)
class Orphan:
    """A pending entry this worker took over from ``owner``."""

    stream: str
    entry_id: str
    fields: Mapping[str, str]
    owner: str
    outcome: ReclaimOutcome
    deliveries: int


class Reclaimer:
    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        name: str,
        max_deliveries: int,
        ttl_s: int,
        held: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        self._redis = client
        self.keys = keys
        self.name = name
        self.max_deliveries = max_deliveries
        self.ttl_s = ttl_s
        self._script = client.register_script(scripts.RECLAIM)
        self._suspects: dict[str, float] = {}  # worker -> when its lease was first seen missing
        self._next_s = 0.0
        # At start this process holds no job: entries pending under its own name are from an
        # earlier life of a worker with the same name (a restarted container), and are taken.
        self._own_checked = False
        # Entry ids this process is running: any other entry pending under its own name is
        # one whose delivery or claim reply was lost to a connection error.
        self._held = held

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._next_s:
            return False
        self._next_s = now + RECLAIM_EVERY_S
        return True

    def take(self, limit: int) -> list[Orphan]:
        """Up to ``limit`` entries of dead workers, claimed and passed through RECLAIM."""
        orphans: list[Orphan] = []
        for stream in self.keys.job_streams:
            for owner in self._dead_owners(stream):
                room = limit - len(orphans)
                if room <= 0:
                    return orphans
                orphans += self._claim(stream, owner, room)
        self._own_checked = True
        return orphans

    def _dead_owners(self, stream: str) -> list[str]:
        try:
            summary: Any = self._redis.xpending(stream, self.keys.group)
        except redis.ResponseError:  # no group yet
            return []
        owners = [str(c["name"]) for c in summary.get("consumers") or [] if int(c["pending"])]
        return [o for o in owners if self._is_dead(o)]

    def _is_dead(self, owner: str) -> bool:
        if owner == self.name:
            return True  # only its own stranded entries are taken: see _claim
        if self._redis.exists(self.keys.lease(owner)):
            self._suspects.pop(owner, None)
            return False
        first = self._suspects.setdefault(owner, time.monotonic())
        return time.monotonic() - first >= LEASE_GRACE_S

    def _claim(self, stream: str, owner: str, limit: int) -> list[Orphan]:
        rows: Any = self._redis.xpending_range(
            stream, self.keys.group, min="-", max="+", count=limit, consumername=owner
        )
        ids = [row["message_id"] for row in rows]
        idle = MIN_IDLE_MS
        if owner == self.name:
            held = set(self._held())
            stranded = int(STRANDED_S * 1000) if self._own_checked else 0
            ids = [
                row["message_id"]
                for row in rows
                if row["message_id"] not in held and row["time_since_delivered"] >= stranded
            ]
            idle = stranded
        if not ids:
            return []
        claimed: Any = self._redis.xclaim(stream, self.keys.group, self.name, idle, ids)
        orphans = []
        for entry_id, fields in claimed:
            if not fields:  # deleted under us: nothing to run
                self._redis.xack(stream, self.keys.group, entry_id)
                continue
            outcome, deliveries = self._reclaim(stream, entry_id, fields, owner)
            log.info(
                "job_reclaimed",
                job_id=fields.get("id"),
                owner=owner,
                outcome=outcome,
                deliveries=deliveries,
            )
            typed = ReclaimOutcome.of(outcome)
            if typed is ReclaimOutcome.OWNED:  # someone resumed it already: the entry is theirs
                self._give_back(stream, entry_id, fields.get("id", ""))
                continue
            orphans.append(Orphan(stream, entry_id, fields, owner, typed, deliveries))
        return orphans

    def _reclaim(
        self, stream: str, entry_id: str, fields: Mapping[str, str], owner: str
    ) -> tuple[str, int]:
        job_id = fields.get("id", "")
        message = (  # RECLAIM fills in {deliveries}: how many workers ran it, not the limit
            # No job id: behind the gateway's auth the stored id is tenant-scoped, and this
            # message reaches the tenant (its error event and status).
            "the job was given up after {deliveries} deliveries: every worker running it "
            "stopped without finishing it; it is in the dead-letter stream"
        )
        error = event_fields(ErrorEvent(code=ErrorCode.DEAD_LETTER.value, message=message))
        keys = [self.keys.job(job_id), self.keys.events(job_id), stream, self.keys.dead_letter]
        args: list[str | int] = [
            self.name,
            owner,
            self.max_deliveries,
            self.ttl_s,
            error["data"],
            self.keys.group,
            entry_id,
            job_id,
            fields.get("payload", ""),
        ]
        outcome, deliveries = self._script(keys=keys, args=args)
        return str(outcome), int(deliveries)

    def _give_back(self, stream: str, entry_id: str, job_id: str) -> None:
        holder = self._redis.hget(self.keys.job(job_id), "worker")
        if holder:
            self._redis.xclaim(stream, self.keys.group, str(holder), 0, [entry_id])


class Resumer:
    """The takeover path, on the intake thread: of the dead workers' jobs the ``Reclaimer``
    took, those that were running continue here from the tokens they streamed; those never
    started are intake's, to be taken as new entries."""

    def __init__(
        self, client: redis.Redis, reclaimer: Reclaimer, limits: PromptLimits, handover: Handover
    ) -> None:
        self._redis = client
        self.reclaimer = reclaimer
        self.keys = reclaimer.keys
        self._limits = limits
        self._handover = handover
        self._log = structlog.get_logger("paternoster.recovery", worker=reclaimer.name)

    def due(self) -> bool:
        return self.reclaimer.due()

    def recover(self, limit: int) -> tuple[int, list[Orphan]]:
        """Take over up to ``limit`` jobs of dead workers: how many resumed here (each now in
        the model loop), and the ones never started, for intake."""
        try:
            orphans = self.reclaimer.take(limit)
        except redis.RedisError as exc:
            self._log.warning("reclaim_failed", error=str(exc))
            return 0, []
        resumed = [o for o in orphans if o.outcome is ReclaimOutcome.RESUMED]
        queued = [o for o in orphans if o.outcome is ReclaimOutcome.QUEUED]
        return sum(self._resume(o) for o in resumed), queued

    def _resume(self, orphan: Orphan) -> bool:
        job_id = orphan.fields.get("id", "")
        try:
            spec, ids, params = parse_job(job_id, orphan.fields.get("payload"), self._limits)
            times: Any = self._redis.hmget(
                self.keys.job(job_id), "submitted_at", "started_at", "first_token_at"
            )
            resume = self.published(job_id, params.n)
            seconds, micros = self._redis.time()
        except Exception as exc:  # it passed intake once: only a worker of another version
            self._log.exception("job_resume_failed", job_id=job_id, error=repr(exc))
            return False
        self._handover.observe_clock(seconds + micros / 1e6)
        submitted, started, first_token = (float(t) if t else None for t in times)
        where = (orphan.stream, orphan.entry_id)
        times_s = (submitted or 0.0, started or 0.0)
        job = self._handover.job(where, spec, ids, params, *times_s, resume, first_token)
        self._log.info(
            "job_resumed",
            job_id=job_id,
            tenant=spec.tenant,
            owner=orphan.owner,
            deliveries=orphan.deliveries,
            resumed_tokens=sum(len(t) for t in resume),
        )
        self._handover.hand_over(job, spec)
        return True

    def published(self, job_id: str, num_choices: int) -> tuple[tuple[int, ...], ...]:
        """The tokens each choice already streamed, from the job's result stream; a repeated
        event (a publish retried after a lost reply) is counted once."""
        tokens: list[list[int]] = [[] for _ in range(num_choices)]
        entries: Any = self._redis.xrange(self.keys.events(job_id))
        for entry_id, fields in entries:
            event = parse_event(entry_id, fields)
            if not isinstance(event, TokenEvent) or event.choice >= num_choices:
                continue
            have = tokens[event.choice]
            skip = len(have) - event.index  # tokens of this event already counted
            if event.index <= len(have):
                have.extend(event.token_ids[skip:])
        return tuple(tuple(t) for t in tokens)
