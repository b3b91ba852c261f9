"""The band reader ages each band's head by the engine's rule: no starvation in Redis either.

A real Redis (the root conftest's); entries are written with explicit stream ids in the past,
so a band's head has "waited" without the test waiting: each test runs in milliseconds.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.keys import Keys
from producer.status import EntryField, StatusField
from tests.service.conftest import tiny_engine
from worker.service.bands import BandReader, entry_ms
from worker.service.build import build_worker
from worker.service.config import WorkerConfig
from worker.service.slots import Slots

RATE_PER_S = 1.0  # batch (10) vs interactive (-10): read once submitted 20 s before its head


@pytest.fixture
def keys(client: redis.Redis, key_prefix: str) -> Keys:
    return Keys(key_prefix)


def reader(
    client: redis.Redis, keys: Keys, aging_per_s: float, slots: Slots | None = None
) -> BandReader:
    config = WorkerConfig(prefix=keys.prefix, name="w1", read_block_ms=10)
    band_reader = BandReader(client, keys, config, slots or Slots(8), aging_per_s)
    band_reader.ensure_group()
    return band_reader


# Sequence parts for explicit stream ids: two entries of one stream written "0 s ago" in one
# millisecond need distinct, growing ids (a fixed "-0" made XADD refuse the second, 1 run in 15).
_SEQUENCE = itertools.count(1)


def past_id(ago_s: float) -> str:
    """A stream id for an entry submitted ``ago_s`` seconds ago by this machine's clock."""
    return f"{int((time.time() - ago_s) * 1000)}-{next(_SEQUENCE)}"


def add(client: redis.Redis, keys: Keys, band: str, ago_s: float | None = None) -> str:
    """An entry in ``band``'s stream, submitted ``ago_s`` seconds ago (None: now)."""
    entry_id = "*" if ago_s is None else past_id(ago_s)
    return str(client.xadd(keys.band(band), {"id": band}, id=entry_id))


def backlog(client: redis.Redis, keys: Keys, batch_ago_s: float) -> str:
    """A batch entry submitted ``batch_ago_s`` ago behind 61 interactive entries submitted one
    a second over the last 60 s; its id."""
    batch_id = add(client, keys, "batch", batch_ago_s)
    for ago_s in range(60, -1, -1):
        add(client, keys, "interactive", float(ago_s))
    return batch_id


def read_until_batch(
    client: redis.Redis, keys: Keys, band_reader: BandReader, reads: int
) -> list[str]:
    """Read one entry at a time, a fresh interactive entry added after each read (the backlog
    never empties); the ids read up to and with the batch entry (or ``reads`` of them)."""
    got: list[str] = []
    for _ in range(reads):
        (entry,) = band_reader.read(1)
        got.append(entry.entry_id)
        add(client, keys, "interactive")
        if entry.stream == keys.band("batch"):
            break
    return got


def test_aged_batch_entry_read_within_the_bound(client: redis.Redis, keys: Keys) -> None:
    batch_id = backlog(client, keys, batch_ago_s=40.0)
    got = read_until_batch(client, keys, reader(client, keys, RATE_PER_S), reads=100)
    assert got[-1] == batch_id
    # Every chat read before it was submitted at most 20 s after it; the next one (left
    # unread) more than 20 s after it: the engine's bound, 20 / rate, to the millisecond.
    bound_ms = 20_000
    assert all(entry_ms(i) - entry_ms(batch_id) <= bound_ms + 5 for i in got[:-1])
    head: Any = client.xrange(keys.band("interactive"), min=f"({got[-2]}", count=1)
    assert entry_ms(str(head[0][0])) - entry_ms(batch_id) >= bound_ms - 5
    assert 40 <= len(got) <= 42  # the chats of the 20 s after it (one a second) went first


def test_without_aging_the_batch_entry_waits(client: redis.Redis, keys: Keys) -> None:
    batch_id = backlog(client, keys, batch_ago_s=40.0)
    got = read_until_batch(client, keys, reader(client, keys, 0.0), reads=100)
    assert len(got) == 100 and batch_id not in got


def test_equal_wait_reads_the_more_urgent_band(client: redis.Redis, keys: Keys) -> None:
    add(client, keys, "batch", 30.0)
    add(client, keys, "default", 30.0)
    first = reader(client, keys, RATE_PER_S).read(1)
    assert [e.stream for e in first] == [keys.band("default")]


def test_an_aged_head_that_overtakes_is_read_alone(client: redis.Redis, keys: Keys) -> None:
    old_batch = add(client, keys, "batch", 60.0)
    fresh_batch = [add(client, keys, "batch", 0.5 - i / 10) for i in range(3)]
    chat = add(client, keys, "interactive")
    band_reader = reader(client, keys, RATE_PER_S)
    assert [e.entry_id for e in band_reader.read(4)] == [old_batch]  # not the fresh ones
    assert [e.entry_id for e in band_reader.read(4)] == [chat]
    assert [e.entry_id for e in band_reader.read(4)] == fresh_batch  # nothing else: all of them


def add_job(client: redis.Redis, keys: Keys, band: str, priority: int, ago_s: float) -> str:
    """An entry of a job of ``priority`` with its status hash, as SUBMIT writes them."""
    job_id = f"{band}-{priority}-{ago_s}"
    entry_id = past_id(ago_s)
    client.hset(keys.job(job_id), StatusField.PRIORITY, priority)
    return str(client.xadd(keys.band(band), {EntryField.ID: job_id}, id=entry_id))


def test_a_head_ages_from_its_jobs_own_priority(client: redis.Redis, keys: Keys) -> None:
    # By the bands' nominal priorities the 25 s old batch head (10 - 25 = -15) would go
    # before the fresh chat (-10); by the jobs' own, 50 - 25 = 25 goes after -1.
    low = add_job(client, keys, "batch", 50, 25.0)
    chat = add_job(client, keys, "interactive", -1, 0.0)
    band_reader = reader(client, keys, RATE_PER_S)
    assert [e.entry_id for e in band_reader.read(1)] == [chat]
    keep = add_job(client, keys, "interactive", -1, 0.0)
    nominal = add(client, keys, "default", 12.0)  # no status hash: the band's 0, -12 now
    assert [e.entry_id for e in band_reader.read(1)] == [nominal]  # -12 before -1
    assert [e.entry_id for e in band_reader.read(1)] == [keep]
    assert [e.entry_id for e in band_reader.read(1)] == [low]


def test_the_urgent_reserve_stays_interactive(client: redis.Redis, keys: Keys) -> None:
    add(client, keys, "batch", 1000.0)  # far more urgent, aged, than any chat
    slots = Slots(8)  # the reserve: 8 // 8 = 1 slot
    slots.take(8, timeout_s=0)  # all held: reading one more is reading into the reserve
    band_reader = reader(client, keys, RATE_PER_S, slots)
    assert band_reader.read(1) == []  # no chat: the reserved slot is not given to batch
    chat_id = add(client, keys, "interactive")
    assert [e.entry_id for e in band_reader.read(1)] == [chat_id]


@pytest.fixture
def round_trips(client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The reader's own round trips: one per command sent through ``client``, one per pipeline
    of it executed.

    Counted on this client, where the reader calls redis-py, not on every socket of the
    process: in CI's full run a thread left behind by an earlier test sent commands of its own
    during the reads (2 expected, 5 counted), and on the socket redis-py 8's retry after its
    5 s default socket timeout and a fresh connection's handshake count too (3, one loaded run).
    """
    sent = [0]
    command, pipeline = client.execute_command, client.pipeline

    def counting_command(*args: Any, **options: Any) -> Any:
        sent[0] += 1
        return command(*args, **options)

    def counting_pipeline(*args: Any, **options: Any) -> Any:
        pipe = pipeline(*args, **options)
        execute = pipe.execute

        def counting_execute(raise_on_error: bool = True) -> Any:
            sent[0] += 1
            return execute(raise_on_error)

        pipe.execute = counting_execute  # type: ignore[method-assign]
        return pipe

    monkeypatch.setattr(client, "execute_command", counting_command)
    monkeypatch.setattr(client, "pipeline", counting_pipeline)
    yield sent


def test_round_trips_per_read_are_bounded(
    client: redis.Redis, keys: Keys, round_trips: list[int]
) -> None:
    band_reader = reader(client, keys, RATE_PER_S)
    add(client, keys, "interactive")

    def trips(count: int = 4) -> int:
        before = round_trips[0]
        band_reader.read(count)
        return round_trips[0] - before

    # Every read: the heads script (every band's head, its job's priority, the time), then
    # the read. Before the script: 2 with one band of entries, 3 with two (the heads' XRANGE
    # pipeline too), and 3 on Redis 6 (no group lag) whenever two bands had entries at all.
    assert trips() == 2  # one band with entries
    add(client, keys, "interactive")
    add(client, keys, "batch", 5.0)
    assert trips() == 2  # two
    assert trips() == 2  # the batch entry now, the only band left
    assert trips() == 2  # all empty: then one blocking read of them all


def test_the_worker_reads_bands_at_the_engines_aging_rate(
    tiny_model_dir: Path, redis_url: str, keys: Keys
) -> None:
    engine = tiny_engine(tiny_model_dir)
    worker = build_worker(engine, redis_url, WorkerConfig(prefix=keys.prefix))
    assert worker.intake.reader.aging_per_s == engine.config.scheduler.aging_per_s > 0
