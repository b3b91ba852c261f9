"""The batch runner driven poll by poll, on a prefix no worker reads: jobs stay queued, so
what it does with them (resume, cancel, the window's end, admission) is seen step by step."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from gateway.auth import Caller
from gateway.batch_runner import BatchRunner
from gateway.batch_store import BatchStatus, BatchStore, new_batch
from gateway.config import GatewayConfig
from gateway.errors import ApiError
from gateway.files_store import FileObject, FileStore, new_file_id
from producer import AsyncProducer
from producer.admission import Cap, band_scope, set_limits
from producer.fleet import WorkerInfo
from producer.keys import Keys

LINES = 8
WINDOW = 3


def rows(count: int = LINES, duplicate: bool = False) -> bytes:
    out = []
    for i in range(count):
        body = {"prompt": f"p{i}", "max_tokens": 4}
        custom_id = "same" if duplicate else f"c{i}"
        out.append({"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
                    "body": body})  # fmt: skip
    return b"".join(json.dumps(r).encode() + b"\n" for r in out)


Scenario = Callable[[BatchRunner, BatchStore, str], Awaitable[None]]


def beat(client: redis.Redis, keys: Keys, name: str, max_num_seqs: int) -> None:
    """A live worker's heartbeat, as a worker writes it (``producer.fleet``)."""
    info = WorkerInfo(name=name, max_num_seqs=max_num_seqs, heartbeat_at=time.time())
    client.hset(keys.worker(name), mapping=info.to_hash())  # type: ignore[arg-type]
    client.zadd(keys.workers, {name: info.heartbeat_at})


def run(
    redis_url: str,
    prefix: str,
    scenario: Scenario,
    content: bytes | None = None,
    **settings: Any,
) -> None:
    """``scenario`` on a batch of ``content``; one live worker of 64 slots unless
    ``slots`` says otherwise (its 0.125 share, 8, is above the window of 3)."""
    slots = settings.pop("slots", [64])
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    for i, count in enumerate(slots):
        beat(client, Keys(prefix), f"w{i}", count)
    client.close()

    async def main() -> None:
        producer = AsyncProducer(redis_url, prefix=prefix)
        config = GatewayConfig(
            redis_url=redis_url, prefix=prefix, **{"batch_window": WINDOW, **settings}
        )
        files = FileStore(producer.redis, producer.keys, None)
        data = rows() if content is None else content
        now = int(time.time())
        meta = FileObject(new_file_id(), len(data), now, now + 60, "in.jsonl", "batch")
        await files.create(meta, data)
        store = BatchStore(producer.redis, producer.keys)
        fields = new_batch("", "/v1/completions", meta.id, ("24h", 86400), None, now)
        await store.create(fields)
        try:
            await scenario(BatchRunner(producer, config), store, fields["id"])
        finally:
            await producer.aclose()

    asyncio.run(main())


def job_count(client: redis.Redis, prefix: str) -> int:
    return sum(1 for _ in client.scan_iter(match=f"{prefix}:job:*", count=1000))


async def error_lines(runner: BatchRunner, fields: dict[str, str]) -> list[dict[str, Any]]:
    meta = await runner.files.get(fields["error_file_id"], Caller())
    return [json.loads(r) for r in (await runner.files.content(meta)).decode().splitlines()]


def test_resume_after_a_runner_dies_then_cancel(
    redis_url: str, key_prefix: str, client: redis.Redis
) -> None:
    async def scenario(first: BatchRunner, store: BatchStore, batch_id: str) -> None:
        await first.poll()  # validating -> in_progress
        assert (await store.read(batch_id))["status"] == "in_progress"
        await first.poll()  # a window of jobs submitted
        assert (await store.read(batch_id))["submitted"] == str(WINDOW)
        await first.redis.delete(Keys(key_prefix).batch_lease(batch_id))  # it died: lapsed
        second = BatchRunner(first.producer, first.config)
        await second.poll()  # resumes with the window in flight: nothing submitted twice
        assert (await store.read(batch_id))["submitted"] == str(WINDOW)
        assert job_count(client, key_prefix) == WINDOW
        assert not await first.hold(batch_id)  # the second holds it now
        await store.move(batch_id, BatchStatus.CANCELLING, int(time.time()))
        for _ in range(3):
            await second.poll()
        fields = await store.read(batch_id)
        assert fields["status"] == "cancelled" and "output_file_id" not in fields
        lines = await error_lines(second, fields)
        assert sorted(r["custom_id"] for r in lines) == sorted(f"c{i}" for i in range(LINES))
        assert {r["error"]["code"] for r in lines} == {"batch_cancelled"}
        assert (await store.body(fields))["request_counts"] == {
            "total": LINES, "completed": 0, "failed": LINES}  # fmt: skip
        assert batch_id not in await first.redis.smembers(Keys(key_prefix).batches_active)

    run(redis_url, key_prefix, scenario)
    states = {client.hget(k, "state") for k in client.scan_iter(match=f"{key_prefix}:job:*")}
    assert states == {"cancelled"}


def test_window_end_expires_the_rest(redis_url: str, key_prefix: str) -> None:
    async def scenario(runner: BatchRunner, store: BatchStore, batch_id: str) -> None:
        await runner.poll()
        await runner.poll()
        past = str(int(time.time()) - 1)
        await runner.redis.hset(Keys(key_prefix).batch(batch_id), "expires_at", past)
        for _ in range(3):
            await runner.poll()
        fields = await store.read(batch_id)
        assert fields["status"] == "expired" and int(fields["expired_at"]) >= int(past)
        lines = await error_lines(runner, fields)
        assert len(lines) == LINES and {r["error"]["code"] for r in lines} == {"batch_expired"}

    run(redis_url, key_prefix, scenario)


def test_admission_limit_defers_lines_not_the_batch(
    redis_url: str, key_prefix: str, client: redis.Redis
) -> None:
    set_limits(client, Keys(key_prefix), band_scope("batch"), Cap(jobs=2))

    async def scenario(runner: BatchRunner, store: BatchStore, batch_id: str) -> None:
        for _ in range(3):
            await runner.poll()
        fields = await store.read(batch_id)
        assert fields["status"] == "in_progress" and fields["submitted"] == "2"

    run(redis_url, key_prefix, scenario)
    assert job_count(client, key_prefix) == 2


def test_duplicate_custom_id_fails_in_validating(redis_url: str, key_prefix: str) -> None:
    async def scenario(runner: BatchRunner, store: BatchStore, batch_id: str) -> None:
        await runner.poll()
        body = await store.body(await store.read(batch_id))
        assert body["status"] == "failed" and body["failed_at"] is not None
        codes = [e["code"] for e in body["errors"]["data"]]
        assert codes == ["duplicate_custom_id"] * (LINES - 1)

    run(redis_url, key_prefix, scenario, rows(duplicate=True))


def test_files_in_a_directory(redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    async def main() -> None:
        producer = AsyncProducer(redis_url, prefix=key_prefix)
        files = FileStore(producer.redis, producer.keys, str(tmp_path))
        now = int(time.time())
        kept, dropped = (FileObject(new_file_id(), 3, now, now + 60, "f", "batch")
                         for _ in range(2))  # fmt: skip
        for meta in (kept, dropped):
            await files.create(meta, b"abc")
        assert await files.content(await files.get(kept.id, Caller())) == b"abc"
        assert not await producer.redis.exists(producer.keys.file_content(kept.id))
        await producer.redis.delete(producer.keys.file(dropped.id))  # as if it expired
        assert await files.sweep() == 1
        assert sorted(p.name for p in tmp_path.iterdir()) == [kept.id]
        for bad in ("../etc", "file-../../x", kept.id + "/"):
            with pytest.raises(ApiError):
                await files.get(bad, Caller())
        page, more = await files.list(Caller(), 10, None)
        assert [f.id for f in page] == [kept.id] and not more
        await files.delete(kept)
        assert not list(tmp_path.iterdir())
        await producer.aclose()

    asyncio.run(main())


@pytest.mark.parametrize(("slots", "in_flight"), [([8, 24], 8), ([], 1), ([64, 64], 20)])
def test_the_window_is_a_share_of_the_fleets_slots(
    redis_url: str, key_prefix: str, slots: list[int], in_flight: int
) -> None:
    async def scenario(runner: BatchRunner, store: BatchStore, batch_id: str) -> None:
        for _ in range(3):
            await runner.poll()
        assert (await store.read(batch_id))["submitted"] == str(in_flight)

    # A quarter of 8 + 24 slots; no live worker: one job at a time; 128 slots: the cap of 20.
    run(redis_url, key_prefix, scenario, rows(40), slots=slots, batch_slot_share=0.25,
        batch_window=20)  # fmt: skip


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_a_share_out_of_range_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="batch_slot_share"):
        GatewayConfig(batch_slot_share=share)
