"""A batch's object in Redis: its status and their transitions, its counts, listing.

The object is one hash (``Keys.batch``) whose fields are OpenAI's batch object's, flat
(``metadata`` and ``errors`` as JSON), plus what the runner needs to resume: ``owner`` (the
tenant), ``total`` and ``submitted`` (lines submitted so far, in order). ``request_counts`` are
never stored: ``completed`` and ``failed`` are the sizes of the batch's output and error hashes
(``Keys.batch_output``, ``Keys.batch_errors``; one field per input line), so no crash between
two writes can make them drift. Batches not yet final are in ``Keys.batches_active``.
"""

from __future__ import annotations

import enum
import json
import re
import uuid
from typing import Any

from redis.exceptions import WatchError

from gateway.auth import Caller
from gateway.errors import ApiError
from gateway.files_store import index_owners, listing_owner, newest_ids
from producer.keys import Keys

BATCH_ID_PATTERN = re.compile(r"^batch_[0-9a-f]{32}$")


class BatchStatus(enum.StrEnum):
    """OpenAI's batch statuses, in the order a batch passes them."""

    VALIDATING = "validating"  # the runner reads and checks the input file
    FAILED = "failed"  # the file as a whole was unusable (``errors`` says why); final
    IN_PROGRESS = "in_progress"  # its jobs are submitted and collected
    FINALIZING = "finalizing"  # every line has its result; the files are being written
    COMPLETED = "completed"  # final: output_file_id / error_file_id hold every line
    EXPIRED = "expired"  # final: the completion window ended first (those lines: errors)
    CANCELLING = "cancelling"  # asked to stop: unfinished jobs are being cancelled
    CANCELLED = "cancelled"  # final: what ran is in the files, the rest are error lines


FINAL = frozenset({BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED,
                   BatchStatus.CANCELLED})  # fmt: skip
# The statuses a batch may move to from each status; a final one moves nowhere.
NEXT: dict[BatchStatus, frozenset[BatchStatus]] = {
    BatchStatus.VALIDATING: frozenset(
        {BatchStatus.IN_PROGRESS, BatchStatus.FAILED, BatchStatus.CANCELLING}
    ),
    BatchStatus.IN_PROGRESS: frozenset({BatchStatus.FINALIZING, BatchStatus.CANCELLING}),
    BatchStatus.FINALIZING: frozenset({BatchStatus.COMPLETED, BatchStatus.EXPIRED}),
    BatchStatus.CANCELLING: frozenset({BatchStatus.CANCELLED}),
}
# The object's fields stored as JSON, and those that are integers.
JSON_FIELDS = ("metadata", "errors")
INT_FIELDS = frozenset(
    {"created_at", "expires_at", "total", "submitted"}
    | {f"{s}_at" for s in BatchStatus if s is not BatchStatus.VALIDATING}
)
# What the object keeps for the runner, and the final counts (``retire`` drops the hashes).
COUNT_FIELDS = ("final_completed", "final_failed")
INTERNAL_FIELDS = frozenset({"owner", "total", "submitted", "window_ended", *COUNT_FIELDS})


def may_move(old: str, new: BatchStatus) -> bool:
    return new in NEXT.get(BatchStatus(old), frozenset())


def time_field(status: BatchStatus) -> str:
    """The object's timestamp of reaching ``status`` (``created_at`` for the first)."""
    return "created_at" if status is BatchStatus.VALIDATING else f"{status}_at"


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


def new_batch(
    owner: str, endpoint: str, input_file_id: str, window: tuple[str, int],
    metadata: dict[str, str] | None, now: int,
) -> dict[str, Any]:  # fmt: skip
    """A new batch's fields (``BatchStore.create``): ``validating``, expiring one completion
    window (its name and seconds) after now."""
    return {"id": new_batch_id(), "status": str(BatchStatus.VALIDATING), "owner": owner,
            "endpoint": endpoint, "input_file_id": input_file_id, "completion_window": window[0],
            "created_at": now, "expires_at": now + window[1], "metadata": metadata}  # fmt: skip


def not_found(batch_id: str) -> ApiError:
    return ApiError(404, f"no batch with id {batch_id!r}", code="batch_not_found")


def batch_body(fields: dict[str, str], completed: int, failed: int) -> dict[str, Any]:
    """OpenAI's batch object from the hash and the sizes of the output and error hashes."""
    body: dict[str, Any] = {"object": "batch"}
    for name, value in fields.items():
        if name in INTERNAL_FIELDS:
            continue
        if name in JSON_FIELDS:
            body[name] = json.loads(value)
        else:
            body[name] = int(value) if name in INT_FIELDS else value
    for status in BatchStatus:
        body.setdefault(time_field(status), None)
    for name in ("output_file_id", "error_file_id", "errors", "metadata"):
        body.setdefault(name, None)
    total = int(fields.get("total", 0))
    body["request_counts"] = {"total": total, "completed": completed, "failed": failed}
    return body


class BatchStore:
    """Batches' objects: create, read, move between statuses, list."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self.redis, self.keys = client, keys  # the producer's decoding redis.asyncio client

    async def create(self, fields: dict[str, Any]) -> None:
        key = self.keys.batch(fields["id"])
        values = {k: json.dumps(v) if k in JSON_FIELDS else str(v) for k, v in fields.items()}
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(key, mapping=values)
        for owner in index_owners(fields["owner"]):
            pipe.zadd(self.keys.batches(owner), {fields["id"]: fields["created_at"]})
        pipe.sadd(self.keys.batches_active, fields["id"])
        await pipe.execute()

    async def read(self, batch_id: str) -> dict[str, str]:
        fields: dict[str, str] = await self.redis.hgetall(self.keys.batch(batch_id))
        return fields

    async def get(self, batch_id: str, who: Caller) -> dict[str, str]:
        """The batch's hash; a 404 for an id unknown, expired or another tenant's."""
        fields = await self.read(batch_id) if BATCH_ID_PATTERN.match(batch_id) else {}
        if not fields or not who.may_see(fields.get("owner") or None):
            raise not_found(batch_id)
        return fields

    async def counts(self, batch_id: str) -> tuple[int, int]:
        """Lines completed and failed so far: the sizes of the batch's per-line hashes."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hlen(self.keys.batch_output(batch_id))
        pipe.hlen(self.keys.batch_errors(batch_id))
        completed, failed = await pipe.execute()
        return int(completed), int(failed)

    async def body(self, fields: dict[str, str]) -> dict[str, Any]:
        if all(name in fields for name in COUNT_FIELDS):  # final: the hashes are gone
            completed, failed = (int(fields[name]) for name in COUNT_FIELDS)
        else:
            completed, failed = await self.counts(fields["id"])
        return batch_body(fields, completed, failed)

    async def move(self, batch_id: str, new: BatchStatus, now: int, **extra: Any) -> bool:
        """Move the batch to ``new`` (stamping its time field, setting ``extra``) if its status
        allows (``NEXT``); False when not. Atomic against a concurrent move (WATCH), so a cancel
        and the runner's finalize never both win."""
        key = self.keys.batch(batch_id)
        values = {"status": str(new), time_field(new): str(now)}
        values |= {k: json.dumps(v) if k in JSON_FIELDS else str(v) for k, v in extra.items()}
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    old = await pipe.hget(key, "status")
                    if old is None or not may_move(old, new):
                        return False
                    pipe.multi()
                    pipe.hset(key, mapping=values)
                    await pipe.execute()
                    return True
                except WatchError:
                    continue

    async def uses_input(self, file_id: str) -> str | None:
        """An unfinished batch that reads ``file_id`` (its runner parses it again after a
        takeover, so it must stay), or None."""
        active = sorted(await self.redis.smembers(self.keys.batches_active))
        pipe = self.redis.pipeline(transaction=False)
        for batch_id in active:
            pipe.hget(self.keys.batch(batch_id), "input_file_id")
        inputs = await pipe.execute()
        return next((b for b, f in zip(active, inputs, strict=True) if f == file_id), None)

    async def retire(self, batch_id: str, ttl_s: int) -> None:
        """A final batch: off the active set, its object kept ``ttl_s``, its per-line hashes
        gone (the files hold them now)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.srem(self.keys.batches_active, batch_id)
        pipe.expire(self.keys.batch(batch_id), ttl_s)
        pipe.delete(self.keys.batch_output(batch_id), self.keys.batch_errors(batch_id))
        await pipe.execute()

    async def list(
        self, who: Caller, limit: int, after: str | None
    ) -> tuple[list[dict[str, Any]], bool]:
        """Up to ``limit`` of the caller's batches, newest first, after the id ``after``."""
        index = self.keys.batches(listing_owner(who))
        ids = await newest_ids(self.redis, index, after, limit + 1)
        found = []
        for batch_id in ids[:limit]:
            fields = await self.read(batch_id)
            if fields and who.may_see(fields.get("owner") or None):
                found.append(await self.body(fields))
            elif not fields:  # expired: its index entry outlived it
                await self.redis.zrem(index, batch_id)
        return found, len(ids) > limit
