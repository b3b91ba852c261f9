"""``paternoster top`` shows what each worker thinks a step costs, from its heartbeat."""

from __future__ import annotations

import dataclasses
import time

import redis

from producer.fleet import StepCostReport, WorkerInfo
from producer.keys import Keys
from producer.top import build_snapshot, render
from worker.engine.block_manager import BlockManager
from worker.engine.config import SchedulerConfig
from worker.engine.scheduler import Scheduler
from worker.engine.step_cost import PRIOR, StepFeatures
from worker.service.reporting import step_cost_report


def beat(client: redis.Redis, keys: Keys, info: WorkerInfo) -> None:
    client.hset(keys.worker(info.name), mapping=info.to_hash())  # type: ignore[arg-type]
    client.zadd(keys.workers, {info.name: info.heartbeat_at})


def test_the_heartbeat_carries_the_step_cost_model() -> None:
    scheduler = Scheduler(SchedulerConfig(), BlockManager(8, 4))
    scheduler.step_cost.observe(StepFeatures(8, 0, 800), 0.07)
    report = step_cost_report(scheduler)
    assert report.measured_s == 0.07
    assert report.predicted_s == PRIOR.predict_s(StepFeatures(8, 0, 800))
    assert report.base_s == scheduler.step_cost.last_fit.base_s
    assert report.targets == "interactive=150" and report.target_s == 0.0
    info = WorkerInfo(name="w", step_cost=report)
    assert WorkerInfo.from_hash(info.to_hash()) == info  # one JSON hash field
    assert "step_cost" not in WorkerInfo(name="w").to_hash()


def test_top_shows_the_fit_the_last_step_and_the_targets(client: redis.Redis, keys: Keys) -> None:
    now = time.time()
    terms = {f.name: getattr(PRIOR, f.name) for f in dataclasses.fields(PRIOR)}
    cost = StepCostReport(
        **terms, measured_s=0.212, predicted_s=0.205, target_s=0.15, targets="interactive=150"
    )
    reported = WorkerInfo(name="w-a", heartbeat_at=now, max_num_seqs=8, step_cost=cost)
    beat(client, keys, reported)
    beat(client, keys, WorkerInfo(name="w-old", heartbeat_at=now, max_num_seqs=4))  # says none
    snap = build_snapshot(client, keys, now_s=now)
    a, old = snap.workers
    assert old.step_cost is None
    assert a.step_cost == cost
    assert snap.to_json()["workers"][0]["step_cost"]["targets"] == "interactive=150"
    lines = render(snap, width=120).splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("STEP COST"))
    assert lines[header].split() == [
        *("STEP", "COST", "BASE", "/DECODE", "/PREFILL", "/CONTEXT"),
        *("LAST", "PREDICTED", "TARGET", "TARGETS"),
    ]
    assert lines[header + 1].split() == [
        *("w-a", "40ms", "1.50ms", "750.0us", "6.0us"),
        *("212ms", "205ms", "150ms", "interactive=150"),
    ]
    assert not any(line.startswith("w-old") for line in lines[header:])  # an older worker


def test_a_worker_without_targets_shows_none_and_off(client: redis.Redis, keys: Keys) -> None:
    now = time.time()
    cost = StepCostReport(0.003, 5e-5, 2e-6, 1e-7, 0.0042, 0.00405, 0.0, "off")
    beat(client, keys, WorkerInfo(name="w-b", heartbeat_at=now, step_cost=cost))
    lines = render(build_snapshot(client, keys, now_s=now), width=120).splitlines()
    row = lines[next(i for i, line in enumerate(lines) if line.startswith("STEP COST")) + 1]
    terms = ["3.00ms", "50.0us", "2.0us", "0.1us"]
    assert row.split() == ["w-b", *terms, "4.20ms", "4.05ms", "none", "off"]
