"""Files of the Batch API: a batch's input, and the output and error files its runner writes.

A file's object (OpenAI's ``file``: id, bytes, created_at, expires_at, filename, purpose) is a
Redis hash (``Keys.file``); its bytes are a Redis string (``Keys.file_content``) or, with
``GatewayConfig.files_dir``, a file of that directory named by its id. Both expire together:
Redis drops the keys at ``expires_at``; in a directory, ``sweep`` (the batch runner calls it)
removes what no object names any more. Each file belongs to its creator's tenant (``owner``,
"" without auth) and the owners' sorted sets (``Keys.files``) list them newest first.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from gateway.auth import Caller
from gateway.errors import ApiError
from producer.keys import Keys

# Ids are key names and, with a files directory, file names: nothing but this alphabet, so no
# id can climb out of the directory ("../x") or reach another key.
FILE_ID_PATTERN = re.compile(r"^file-[A-Za-z0-9_-]{1,64}$")
ALL_OWNERS = "*"  # the index every file is in; a tenant's own index lists only its files
# Objects read a round trip when a listing filters by purpose: 1,000 HGETALLs of ~200 bytes.
SCAN_CHUNK = 1000


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


def index_owners(owner: str) -> tuple[str, ...]:
    """The indexes a file or batch of ``owner`` goes into: everyone's, and its tenant's."""
    return (ALL_OWNERS, owner) if owner else (ALL_OWNERS,)


def listing_owner(who: Caller) -> str:
    """The index a caller lists: its tenant's behind auth, everyone's without."""
    return who.tenant if who.tenant is not None else ALL_OWNERS


async def start_rank(client: Any, index: str, after: str | None) -> int | None:
    """Where a page of an index (a sorted set by creation time, read newest first) starts:
    after the id ``after``; None when the index does not hold it (no page follows)."""
    if after is None:
        return 0
    rank = await client.zrevrank(index, after)
    return None if rank is None else int(rank) + 1


async def newest_ids(client: Any, index: str, after: str | None, count: int) -> list[str]:
    """A page of an index: ``count`` ids, newest first, after the id ``after``."""
    start = await start_rank(client, index, after)
    if start is None:
        return []
    ids: list[str] = await client.zrevrange(index, start, start + count - 1)
    return ids


@dataclass(frozen=True)
class FileObject:
    id: str
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: str
    owner: str = ""  # the tenant it belongs to ("" when created without auth)

    def body(self) -> dict[str, Any]:
        """OpenAI's file object (``status`` is deprecated there, and always ``processed``)."""
        fields = asdict(self)
        del fields["owner"]
        return {**fields, "object": "file", "status": "processed", "status_details": None}

    @classmethod
    def from_hash(cls, fields: dict[str, str]) -> FileObject:
        ints = {k: int(fields[k]) for k in ("bytes", "created_at", "expires_at")}
        return cls(fields["id"], filename=fields["filename"], purpose=fields["purpose"],
                   owner=fields.get("owner", ""), **ints)  # fmt: skip


def not_found(file_id: str) -> ApiError:
    return ApiError(404, f"no file with id {file_id!r}", code="file_not_found", param="file_id")


class FileStore:
    """Create, read, list and delete files; ``files_dir`` None keeps the bytes in Redis."""

    def __init__(self, client: Any, keys: Keys, files_dir: str | None) -> None:
        # `client`: the producer's redis.asyncio client (decode_responses: replies are str)
        self.redis, self.keys = client, keys
        self.files_dir = Path(files_dir) if files_dir else None

    def _path(self, file_id: str) -> Path:
        assert self.files_dir is not None and FILE_ID_PATTERN.match(file_id)
        return self.files_dir / file_id

    async def create(self, meta: FileObject, content: bytes) -> FileObject:
        """Store ``content`` under ``meta.id``; the same id again replaces it (a runner that
        finalizes a batch twice writes the same output file twice)."""
        ttl_s = max(1, meta.expires_at - int(time.time()))
        if self.files_dir is not None:
            self.files_dir.mkdir(parents=True, exist_ok=True)
            self._path(meta.id).write_bytes(content)
        pipe = self.redis.pipeline(transaction=True)
        if self.files_dir is None:
            pipe.set(self.keys.file_content(meta.id), content, ex=ttl_s)
        pipe.hset(self.keys.file(meta.id), mapping={k: str(v) for k, v in asdict(meta).items()})
        pipe.expire(self.keys.file(meta.id), ttl_s)
        for owner in index_owners(meta.owner):
            pipe.zadd(self.keys.files(owner), {meta.id: meta.created_at})
        await pipe.execute()
        return meta

    async def get(self, file_id: str, who: Caller) -> FileObject:
        """The file's object; a 404 for an id that is unknown, expired or another tenant's."""
        if not FILE_ID_PATTERN.match(file_id):
            raise not_found(file_id)
        fields: dict[str, str] = await self.redis.hgetall(self.keys.file(file_id))
        if not fields or not who.may_see(fields.get("owner") or None):
            raise not_found(file_id)
        return FileObject.from_hash(fields)

    async def content(self, meta: FileObject) -> bytes:
        if self.files_dir is not None:
            try:
                return self._path(meta.id).read_bytes()
            except FileNotFoundError:
                raise not_found(meta.id) from None
        data = await self.redis.get(self.keys.file_content(meta.id))
        if data is None:  # expired between the two reads
            raise not_found(meta.id)
        return data.encode() if isinstance(data, str) else data  # uploads are UTF-8 (files_api)

    async def delete(self, meta: FileObject) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.keys.file(meta.id), self.keys.file_content(meta.id))
        for owner in index_owners(meta.owner):
            pipe.zrem(self.keys.files(owner), meta.id)
        await pipe.execute()
        if self.files_dir is not None:
            self._path(meta.id).unlink(missing_ok=True)

    async def list(
        self, who: Caller, limit: int, after: str | None, purpose: str | None = None
    ) -> tuple[list[FileObject], bool]:
        """Up to ``limit`` of the caller's files of ``purpose`` (None: any), newest first, after
        the id ``after``; and whether more follow. The filter runs before the page is cut, so a
        page is short only at the end: the index is read in chunks (``SCAN_CHUNK`` objects a
        round trip when filtering) until ``limit + 1`` match. Entries of expired files are
        dropped from the index here."""
        index = self.keys.files(listing_owner(who))
        start = await start_rank(self.redis, index, after)
        if start is None:
            return [], False
        chunk = limit + 1 if purpose is None else max(limit + 1, SCAN_CHUNK)
        found: list[FileObject] = []
        gone: list[str] = []
        while len(found) <= limit:
            ids: list[str] = await self.redis.zrevrange(index, start, start + chunk - 1)
            pipe = self.redis.pipeline(transaction=False)  # a chunk: one round trip
            for file_id in ids:
                pipe.hgetall(self.keys.file(file_id))
            for file_id, fields in zip(ids, await pipe.execute(), strict=True):
                if not fields:
                    gone.append(file_id)
                elif who.may_see(fields.get("owner") or None) and purpose in (
                    None,
                    fields["purpose"],
                ):
                    found.append(FileObject.from_hash(fields))
            if len(ids) < chunk:
                break
            start += chunk
        if gone:  # only now: removing them earlier would shift the ranks still to read
            await self.redis.zrem(index, *gone)
        return found[:limit], len(found) > limit

    async def extend(self, meta: FileObject, expires_at: int) -> FileObject:
        """Keep the file at least until ``expires_at`` (never shortened): a batch's input must
        outlive the batch, whose runner parses it again after a takeover."""
        if expires_at <= meta.expires_at:
            return meta
        pipe = self.redis.pipeline(transaction=True)
        pipe.expireat(self.keys.file(meta.id), expires_at)
        pipe.expireat(self.keys.file_content(meta.id), expires_at)  # 0 with a files_dir
        alive, _ = await pipe.execute()
        if not alive:  # it expired a moment ago
            raise not_found(meta.id)
        await self.redis.hset(self.keys.file(meta.id), "expires_at", str(expires_at))
        return replace(meta, expires_at=expires_at)

    async def sweep(self) -> int:
        """Remove the directory's files whose object expired; how many it removed."""
        if self.files_dir is None or not self.files_dir.is_dir():
            return 0
        paths = [p for p in self.files_dir.iterdir() if FILE_ID_PATTERN.match(p.name)]
        pipe = self.redis.pipeline(transaction=False)
        for path in paths:
            pipe.exists(self.keys.file(path.name))
        alive = await pipe.execute()
        gone = [p for p, live in zip(paths, alive, strict=True) if not live]
        for path in gone:
            path.unlink(missing_ok=True)
        return len(gone)
