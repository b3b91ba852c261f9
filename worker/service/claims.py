"""How intake ends or starts a jobs-stream entry in Redis: the ``CLAIM`` script, and the
dead-letter move for an entry whose id names no job.

``CLAIM`` answers with a string; ``Claims`` turns it into a ``Claim`` whose ``outcome`` is one
of four, so intake branches on an enum, not on the script's spellings.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from producer import scripts
from producer.keys import DEAD_LETTER_MAXLEN, Keys
from producer.protocol import ErrorCode, ErrorEvent


class ClaimOutcome(enum.Enum):
    """What ``CLAIM`` did with an entry: its answer (``scripts.ClaimAnswer``), or ``SKIPPED``
    when it answered the job's state instead. Every outcome but ``STARTED`` ended the entry's
    delivery: it is acknowledged and deleted, nothing of it is left to run."""

    STARTED = scripts.ClaimAnswer.STARTED  # running here now, `started` published: run it
    REJECTED = scripts.ClaimAnswer.REJECTED  # refused (as asked): `error` published
    EXPIRED = scripts.ClaimAnswer.EXPIRED  # deadline passed while queued (or it had expired)
    SKIPPED = "skipped"  # not queued (cancelled, ended, another worker's): nothing published


@dataclass(frozen=True)
class Claim:
    outcome: ClaimOutcome
    state: str  # CLAIM's own answer: the outcome, or the job's state when it skipped the job
    submitted_at: float  # Redis clock, unix s (0.0 when skipped)
    now: float  # Redis clock, unix s, at the claim: the job's started_at when it started

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> Claim:
        answer, submitted, now = (str(part) for part in reply)
        try:
            outcome = ClaimOutcome(scripts.ClaimAnswer(answer))
        except ValueError:  # the job's state: it was not queued
            outcome = ClaimOutcome.SKIPPED
        return cls(outcome, answer, float(submitted or 0.0), float(now or 0.0))


class Claims:
    def __init__(self, client: redis.Redis, keys: Keys, name: str, result_ttl_s: int) -> None:
        self._redis = client
        self.keys = keys
        self.name = name
        self.result_ttl_s = result_ttl_s
        self._claim = client.register_script(scripts.CLAIM)

    def start(self, stream: str, entry_id: str, job_id: str, deadline: float | None) -> Claim:
        """Start the job of a valid entry: ``STARTED``, unless it is no longer queued or its
        ``deadline`` (unix s, Redis clock) has passed."""
        return self._run(stream, entry_id, job_id, scripts.ClaimAction.START, deadline=deadline)

    def reject(
        self, stream: str, entry_id: str, job_id: str, code: ErrorCode, message: str
    ) -> Claim:
        """End the job of an entry that cannot run with an ``error`` event (``REJECTED``; or
        ``SKIPPED``: it had ended already)."""
        error = ErrorEvent(code=code.value, message=message)
        return self._run(stream, entry_id, job_id, scripts.ClaimAction.REJECT, error=error)

    def dead_letter(self, stream: str, entry_id: str, fields: Mapping[str, str]) -> None:
        """An entry whose id names no valid result stream has nowhere to get its error event:
        it moves, whole, to the dead-letter stream (``reason`` invalid_id), so nothing is lost
        and nobody waits on it."""
        entry: dict[Any, Any] = {**fields, "entry_id": entry_id, "reason": "invalid_id"}
        entry["worker"] = self.name
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.xadd(self.keys.dead_letter, entry, maxlen=DEAD_LETTER_MAXLEN, approximate=True)
            pipe.xack(stream, self.keys.group, entry_id)
            pipe.xdel(stream, entry_id)
            pipe.execute()

    def _run(
        self,
        stream: str,
        entry_id: str,
        job_id: str,
        action: scripts.ClaimAction,
        deadline: float | None = None,
        error: ErrorEvent | None = None,
    ) -> Claim:
        keys = scripts.claim_keys(self.keys, job_id, stream)
        args = scripts.claim_args(
            self.keys,
            action=action,
            worker=self.name,
            entry_id=entry_id,
            ttl_s=self.result_ttl_s,
            deadline=deadline,
            error=error,
        )
        return Claim.from_reply(self._claim(keys=keys, args=args))
