"""Priority, deadlines, wait reasons and heartbeats through Redis, on the tiny model."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from producer import JobExpired, JobFailed, JobHandle, Overloaded, Producer
from producer.admission import Cap, Limits, read_load, write_limits
from producer.fleet import live_workers
from tests.service.conftest import running_worker, tiny_engine
from tests.service.streams import check_stream
from worker.engine.llm_engine import LLMEngine
from worker.engine.outputs import RequestOutput
from worker.engine.sampling_params import SamplingParams
from worker.service.metrics import WorkerMetrics
from worker.service.publisher import Command

GREEDY = {"temperature": 0.0, "ignore_eos": True}


def slowed(engine: LLMEngine, step_s: float) -> LLMEngine:
    """The engine with each step taking at least ``step_s``: time-based behaviour (deadlines,
    waits) then does not depend on how fast this machine runs a tiny model."""
    step: Callable[[], list[RequestOutput]] = engine.step

    def slow_step() -> list[RequestOutput]:
        time.sleep(step_s)
        return step()

    engine.step = slow_step  # type: ignore[method-assign]
    return engine


def wait_until(check: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)
    return value


def test_urgent_job_overtakes_a_batch_flood_and_preempted_jobs_resume_exactly(
    tiny_model_dir: Path, redis_url: str, prefix: str
) -> None:
    # The batch bound off: ``slowed`` adds 10 ms to each served step and none to the offline
    # run's, which the bound would take for the cost of a chat's own step (batch_cap.py).
    engine = tiny_engine(tiny_model_dir, seqs=2, urgent_step_max=0)
    prompts = [f"batch job number {i}" for i in range(8)]
    offline = engine.generate(prompts, SamplingParams(max_tokens=60, **GREEDY))
    slowed(engine, 0.01)
    with (
        running_worker(engine, redis_url, prefix) as worker,
        Producer(redis_url, prefix=prefix) as p,
    ):
        batch = [p.submit(t, max_tokens=60, priority="batch", **GREEDY) for t in prompts]
        # Every slot but the reserved one is held by batch jobs; the rest wait in Redis.
        held = worker.slots.capacity - 1
        wait_until(lambda: sum(h.status().state == "running" for h in batch) == held)
        wait_until(lambda: sum(h.status().first_token_at is not None for h in batch) == 2)
        without_token = [h for h in batch if h.status().first_token_at is None]
        urgent = p.submit("urgent", max_tokens=5, priority="interactive", **GREEDY)
        assert len(urgent.result(timeout_s=30).token_ids) == 5
        results = [h.result(timeout_s=60) for h in batch]
        first_urgent = urgent.status().first_token_at
        assert first_urgent is not None and len(without_token) == 6
        for handle in without_token:
            assert first_urgent < (handle.status().first_token_at or 0), handle.job_id
        for handle, result, expected in zip(batch, results, offline, strict=True):
            assert check_stream(list(p.stream(handle.job_id))) == list(expected.token_ids)
            assert result.token_ids == list(expected.token_ids)
        preempted = [h for h in batch if (h.status().preemptions or 0) > 0]
        assert preempted, "the urgent job preempted a running batch job"
        assert engine.scheduler.preemptions_by_reason["priority"] >= 1


def test_deadline_ends_a_running_job_with_what_it_produced_and_a_waiting_one_expires(
    tiny_model_dir: Path, redis_url: str, prefix: str
) -> None:
    engine = slowed(tiny_engine(tiny_model_dir, seqs=1), 0.01)
    with (
        running_worker(engine, redis_url, prefix),
        Producer(redis_url, prefix=prefix) as p,
    ):
        running = p.submit("long", max_tokens=400, deadline_s=0.8, **GREEDY)
        waiting = p.submit("never runs", max_tokens=5, deadline_s=0.5, **GREEDY)
        result = running.result(timeout_s=30)
        assert result.finish_reason == "deadline"
        assert 0 < len(result.token_ids) < 400
        assert check_stream(list(p.stream(running.job_id))) == result.token_ids
        assert running.status().finish_reason == "deadline"
        with pytest.raises(JobExpired):
            waiting.result(timeout_s=30)
        assert waiting.status().state == "expired"
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_job_waiting_in_the_worker_shows_why_and_workers_heartbeat(
    tiny_model_dir: Path, redis_url: str, prefix: str
) -> None:
    engine = slowed(tiny_engine(tiny_model_dir, seqs=1), 0.01)
    metrics = WorkerMetrics("w-test")
    with (
        running_worker(engine, redis_url, prefix, name="w-test", metrics=metrics),
        Producer(redis_url, prefix=prefix) as p,
    ):
        first = p.submit("first", max_tokens=250, **GREEDY)
        second = p.submit("second", max_tokens=5, **GREEDY)
        # Queued in Redis it may first read "no_worker" until the first heartbeat lands.
        status = wait_until(lambda: (s := second.status()).wait_reason == "no_batch_slot" and s)
        assert status.state == "running" and status.position == 0
        # Heartbeats come about once a second: wait for one from the busy worker.
        workers = wait_until(lambda: (w := live_workers(p.redis, p.keys)) and w[0].steps and w)
        assert [w.name for w in workers] == ["w-test"]
        assert workers[0].running == 1 and workers[0].max_num_seqs == 1
        assert workers[0].kv_blocks_used > 0
        first.result(timeout_s=30)
        second.result(timeout_s=30)
        assert second.status().wait_reason is None  # cleared when it started
        text = metrics.render().decode()
        assert 'finish_reason="length",outcome="done"' in text
    with Producer(redis_url, prefix=prefix) as p:
        assert live_workers(p.redis, p.keys) == []  # it said goodbye on stop


def test_a_job_that_waited_ends_in_its_steps_one_round_trip(
    tiny_model_dir: Path, redis_url: str, prefix: str
) -> None:
    """Clearing an ended job's wait fields goes with the step's own events: a worker step is
    one publish, so one round trip. Sent apart, a step that ended 4 jobs took 5."""
    engine = slowed(tiny_engine(tiny_model_dir, seqs=1), 0.05)
    with (
        running_worker(engine, redis_url, prefix) as worker,
        Producer(redis_url, prefix=prefix) as p,
    ):
        batches: list[list[Command]] = []
        per_step: list[int] = []
        publish, step = worker.publisher.publish, worker.step

        def recording_publish(commands: Sequence[Command]) -> None:
            if commands:
                batches.append(list(commands))
            publish(commands)

        def counted_step() -> None:
            before = len(batches)
            step()
            per_step.append(len(batches) - before)

        worker.publisher.publish = recording_publish  # type: ignore[method-assign]
        worker.step = counted_step  # type: ignore[method-assign]
        first = p.submit("first", max_tokens=12, **GREEDY)
        second = p.submit("second", max_tokens=1, **GREEDY)
        wait_until(lambda: second.status().wait_reason == "no_batch_slot")
        first.result(timeout_s=30)
        second.result(timeout_s=30)
        assert second.status().wait_reason is None
    cleared = worker.keys.job(second.job_id)
    assert any(c.name == "HDEL" and c.args[0] == cleared for b in batches for c in b)
    assert per_step and max(per_step) == 1


def test_a_prompt_larger_than_the_whole_kv_pool_fails_at_once_and_the_queue_moves(
    tiny_model_dir: Path, redis_url: str, prefix: str
) -> None:
    engine = tiny_engine(tiny_model_dir, num_blocks=8)  # 32 tokens of KV; the context is 512
    with (
        running_worker(engine, redis_url, prefix),
        Producer(redis_url, prefix=prefix) as p,
    ):
        huge = p.submit(prompt_token_ids=list(range(5, 45)), max_tokens=2, **GREEDY)
        after = p.submit("short", max_tokens=3, **GREEDY)
        with pytest.raises(JobFailed) as failed:
            huge.result(timeout_s=30)
        assert failed.value.code == "prompt_too_long" and "KV pool" in str(failed.value)
        assert len(after.result(timeout_s=30).token_ids) == 3


def test_overload_refuses_beyond_the_limit_and_every_accepted_job_completes(
    tiny_model_dir: Path, redis_url: str, prefix: str
) -> None:
    engine = slowed(tiny_engine(tiny_model_dir, seqs=2), 0.005)
    with (
        running_worker(engine, redis_url, prefix, max_jobs=2),
        Producer(redis_url, prefix=prefix) as p,
    ):
        write_limits(p.redis, p.keys, Limits(bands={"default": Cap(jobs=3)}))
        accepted: list[JobHandle] = []
        refused: list[Overloaded] = []
        lock = threading.Lock()

        def submit_many(n: int) -> None:
            for i in range(n):
                try:
                    handle = p.submit(f"job {i}", max_tokens=12, **GREEDY)
                except Overloaded as exc:
                    with lock:
                        refused.append(exc)
                else:
                    with lock:
                        accepted.append(handle)

        threads = [threading.Thread(target=submit_many, args=(10,)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert refused and accepted and len(refused) + len(accepted) == 40
        assert {(e.scope, e.kind, e.limit) for e in refused} == {("band:default", "jobs", 3)}
        for handle in accepted:  # nothing hangs: every accepted job ends done
            assert len(handle.result(timeout_s=60).token_ids) == 12
        load = read_load(p.redis, p.keys.band_load("default"))
        assert (load.jobs, load.tokens) in ((0, 0), (None, None))


def test_after_a_short_real_run_every_documented_metric_is_exported_with_sane_values(
    tiny_model_dir: Path, redis_url: str, prefix: str
) -> None:
    from tests.service.test_metrics import documented, exported, samples

    engine = tiny_engine(tiny_model_dir, seqs=2)
    metrics = WorkerMetrics("w-metrics")
    with (
        running_worker(engine, redis_url, prefix, metrics=metrics),
        Producer(redis_url, prefix=prefix) as p,
    ):
        handles = [p.submit(f"metered {i}", max_tokens=6, **GREEDY) for i in range(5)]
        for handle in handles:
            handle.result(timeout_s=30)
        p.redis.xadd(p.keys.jobs, {"id": "bad-one", "payload": "{not json"})
        wait_until(lambda: p.redis.exists(p.keys.events("bad-one")))
        time.sleep(1.2)  # one more queue-depth sample by the intake
    assert set(documented()) <= exported(metrics)
    got = samples(metrics)

    def total(name: str, **labels: str) -> float:
        want = set(labels.items())
        return sum(v for (n, lab), v in got.items() if n == name and want <= lab)

    assert total("paternoster_steps_total") > 0
    assert total("paternoster_generated_tokens_total") == 30
    assert total("paternoster_jobs_finished_total", outcome="done") == 5
    assert total("paternoster_jobs_rejected_total", code="malformed_json") == 1
    assert total("paternoster_time_to_first_token_seconds_count") == 5
    assert 0 < total("paternoster_time_to_first_token_seconds_sum") < 30
    assert total("paternoster_kv_cache_total_blocks") == engine.block_manager.num_blocks
