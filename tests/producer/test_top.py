"""``paternoster top``: the snapshot read from hand-written keys, its frame, the CLI and loop."""

from __future__ import annotations

import io
import json
import time

import pytest
import redis

from producer.fleet import WorkerInfo
from producer.keys import Keys
from producer.top import build_snapshot, render, run_loop
from producer.top.render import MIN_FLEX
from producer.top.snapshot import Snapshot, percentile
from worker.cli import main

Capsys = pytest.CaptureFixture[str]
T0 = 1_700_000_000.0  # job times: any fixed unix time; only the differences are shown


def beat(client: redis.Redis, keys: Keys, info: WorkerInfo) -> None:
    """What ``Reporter.heartbeat`` writes."""
    client.hset(keys.worker(info.name), mapping=info.to_hash())  # type: ignore[arg-type]
    client.zadd(keys.workers, {info.name: info.heartbeat_at})


def job(client: redis.Redis, keys: Keys, job_id: str, **fields: object) -> None:
    """A status hash, and the id at the head of the recent list (newest first, as SUBMIT)."""
    client.hset(keys.job(job_id), mapping={k: str(v) for k, v in fields.items()})
    client.lpush(keys.recent, job_id)


def queue(client: redis.Redis, keys: Keys, band: str, n: int, group: bool) -> list[str]:
    stream = keys.band(band)
    if group:
        client.xgroup_create(stream, keys.group, id="0", mkstream=True)
    return [str(client.xadd(stream, {"id": f"q-{band}-{i}", "payload": "{}"})) for i in range(n)]


def done(client: redis.Redis, keys: Keys, job_id: str, ttft_s: float, total_s: float) -> None:
    job(
        client,
        keys,
        job_id,
        state="done",
        tenant="acme",
        priority=0,
        submitted_at=T0,
        started_at=T0 + 0.01,
        first_token_at=T0 + ttft_s,
        finished_at=T0 + total_s,
        completion_tokens=16,
        worker="w-a",
    )


@pytest.fixture
def deployment(client: redis.Redis, keys: Keys) -> float:
    """Two live workers and a dead one, queued entries in every band, five recent jobs."""
    now = time.time()
    beat(client, keys, WorkerInfo(
        name="w-a", model="tiny", running=3, max_num_seqs=8, waiting=1, kv_blocks_used=42,
        kv_blocks_total=100, steps=1234, generated_tokens=5000, heartbeat_at=now - 0.5,
    ))  # fmt: skip
    beat(client, keys, WorkerInfo(name="w-b", max_num_seqs=4, heartbeat_at=now, draining=True))
    beat(client, keys, WorkerInfo(name="w-dead", heartbeat_at=now - 60))  # past the TTL
    queue(client, keys, "interactive", 2, group=True)  # lag 2
    default_ids = queue(client, keys, "default", 3, group=False)  # no group: its length, 3
    queue(client, keys, "batch", 4, group=True)
    client.xreadgroup(keys.group, "w-a", {keys.band("batch"): ">"}, count=1)  # lag 3
    for i, (ttft_s, total_s) in enumerate([(0.3, 3.0), (0.1, 1.0), (0.4, 4.0), (0.2, 2.0)]):
        done(client, keys, f"done-{i}", ttft_s, total_s)
    job(client, keys, "gone", state="done")  # its hash expired: skipped
    client.delete(keys.job("gone"))
    job(client, keys, "run-1", state="running", tenant="beta", priority=-10, submitted_at=T0,
        started_at=T0 + 0.5, worker="w-a", wait_reason="kv_cache_full", position=1,
        preemptions=2)  # fmt: skip
    job(client, keys, "queued-1", state="queued", tenant="acme", priority=0, band="default",
        submitted_at=T0, stream_id=default_ids[2])  # fmt: skip
    return now


def batch_depth(client: redis.Redis) -> int:
    """Redis 7 reports a group's lag (3 undelivered in batch); 6.2 (the embedded server when
    REDIS_URL is unset) does not, and the depth falls back to the stream's length, 4."""
    return 3 if int(str(client.info("server")["redis_version"]).split(".")[0]) >= 7 else 4


def test_snapshot_reads_queues_workers_and_jobs(
    client: redis.Redis, keys: Keys, deployment: float
) -> None:
    snap = build_snapshot(client, keys, now_s=deployment)
    # Redis 7 reports a group's lag (3 undelivered in batch); 6.2 (the embedded server when
    # REDIS_URL is unset) does not, and the depth falls back to the stream's length, 4.
    batch = batch_depth(client)
    assert dict(snap.queue_depths) == {"interactive": 2, "default": 3, "batch": batch}
    a, b = snap.workers
    assert (a.name, a.running, a.max_num_seqs, a.waiting, a.steps) == ("w-a", 3, 8, 1, 1234)
    assert a.kv_usage == pytest.approx(0.42) and a.generated_tokens == 5000
    assert a.heartbeat_age_s == pytest.approx(0.5) and a.tokens_per_s is None  # one frame only
    assert b.name == "w-b" and b.draining and not a.draining
    ids = [j.job_id for j in snap.jobs]
    assert ids == ["queued-1", "run-1", "done-3", "done-2", "done-1", "done-0"]
    queued, running = snap.jobs[0], snap.jobs[1]
    # 2 undelivered interactive entries ahead, plus the 2 default entries before its own.
    assert (queued.wait_reason, queued.position) == ("behind_higher_priority", 4)
    assert (running.wait_reason, running.position, running.preemptions) == ("kv_cache_full", 1, 2)
    assert running.tenant == "beta" and running.priority == -10 and running.ttft_s is None
    assert snap.jobs[2].ttft_s == pytest.approx(0.2) and snap.jobs[2].total_s == pytest.approx(2)
    lat = snap.latency
    assert lat.finished == 4
    assert lat.ttft_p50_s == pytest.approx(0.2) and lat.ttft_p99_s == pytest.approx(0.4)
    assert lat.e2e_p50_s == pytest.approx(2.0) and lat.e2e_p99_s == pytest.approx(4.0)


def test_frame_shows_the_numbers(client: redis.Redis, keys: Keys, deployment: float) -> None:
    frame = render(build_snapshot(client, keys, now_s=deployment), width=140, interval_s=1)
    batch = batch_depth(client)
    for text in (
        "interactive 2",
        "default 3",
        f"batch {batch}",
        f"total {5 + batch}",
        "workers: 2 live",
    ):
        assert text in frame
    worker_line = next(line for line in frame.splitlines() if line.startswith("w-a"))
    assert worker_line.split() == ["w-a", "3/8", "1", "42.0", "1234", "5000", "-", "0.5s"]
    assert "draining" in next(line for line in frame.splitlines() if line.startswith("w-b"))
    assert "w-dead" not in frame
    assert "behind_higher_priority #4" in frame and "kv_cache_full #1" in frame
    assert "latency over 4 done: TTFT p50 200ms p99 400ms; end-to-end p50 2.00s p99 4.00s" in frame
    done_line = next(line for line in frame.splitlines() if line.startswith("done-3"))
    assert done_line.split() == ["done-3", "acme", "0", "done", "16", "200ms", "2.00s", "w-a"]


def test_frame_fits_the_width_and_height(
    client: redis.Redis, keys: Keys, deployment: float
) -> None:
    job(client, keys, "a-very-long-job-id-" + "x" * 60, state="queued")
    snap = build_snapshot(client, keys, now_s=deployment)
    frame = render(snap, width=60, height=14)
    assert all(len(line) <= 60 for line in frame.splitlines())
    assert len(frame.splitlines()) <= 14
    assert "a-very-…"[:MIN_FLEX] in frame and "xxxxxxxxxx" not in frame
    assert "recent jobs: " in frame and f"of {len(snap.jobs)} shown" in frame


def test_tokens_per_s_from_two_snapshots(client: redis.Redis, keys: Keys) -> None:
    now = time.time()
    info = WorkerInfo(name="w", generated_tokens=1000, heartbeat_at=now - 2)
    beat(client, keys, info)
    first = build_snapshot(client, keys, now_s=now)
    beat(client, keys, info.model_copy(update={"generated_tokens": 1500, "heartbeat_at": now}))
    second = build_snapshot(client, keys, previous=first, now_s=now + 0.5)
    assert second.workers[0].tokens_per_s == pytest.approx(250.0)
    # The same heartbeat read again (refresh faster than beats): the last rate stands.
    third = build_snapshot(client, keys, previous=second, now_s=now + 1.0)
    assert third.workers[0].tokens_per_s == pytest.approx(250.0)
    assert "250.0" in render(third)
    # Fewer tokens than before: a restarted worker under the same name; no rate yet.
    beat(client, keys, info.model_copy(update={"generated_tokens": 7, "heartbeat_at": now + 1}))
    assert build_snapshot(client, keys, previous=third).workers[0].tokens_per_s is None


def test_empty_deployment(client: redis.Redis, keys: Keys) -> None:
    snap = build_snapshot(client, keys)
    assert dict(snap.queue_depths) == {"interactive": 0, "default": 0, "batch": 0}
    assert snap.workers == () and snap.jobs == () and snap.latency.finished == 0
    frame = render(snap)
    assert "no live workers" in frame and "no recent jobs" in frame
    assert "no finished jobs" in frame


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0


def test_cli_once_json(
    client: redis.Redis, redis_url: str, key_prefix: str, deployment: float, capsys: Capsys
) -> None:
    rc = main(["top", "--redis-url", redis_url, "--prefix", key_prefix, "--once", "--json"])
    out, _ = capsys.readouterr()
    assert rc == 0
    snap = json.loads(out)
    assert snap["prefix"] == key_prefix
    assert snap["queue_depths"] == {"interactive": 2, "default": 3, "batch": batch_depth(client)}
    assert [w["name"] for w in snap["workers"]] == ["w-a", "w-b"]
    assert snap["workers"][0]["running"] == 3 and snap["workers"][1]["draining"] is True
    assert snap["jobs"][0]["position"] == 4 and snap["latency"]["finished"] == 4


def test_cli_once_text_and_bad_flags(redis_url: str, key_prefix: str, capsys: Capsys) -> None:
    base = ["top", "--redis-url", redis_url, "--prefix", key_prefix]
    assert main([*base, "--once"]) == 0
    assert "no live workers" in capsys.readouterr().out
    assert main([*base, "--json"]) == 2  # a live view has no JSON form
    assert "--json needs --once" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--interval-s", "0"])


def test_loop_redraws_in_place(client: redis.Redis, keys: Keys) -> None:
    beat(client, keys, WorkerInfo(name="w", heartbeat_at=time.time()))
    out = io.StringIO()
    assert run_loop(client, keys, interval_s=0.01, out=out, frames=2) == 0
    text = out.getvalue()
    assert text.count("\x1b[H") == 2 and text.count("workers: 1 live") == 2
    assert isinstance(build_snapshot(client, keys), Snapshot)
