"""``paternoster top`` shows what each worker thinks a step costs, from its heartbeat."""

from __future__ import annotations

import dataclasses
import time

import redis

from producer.fleet import WorkerInfo
from producer.keys import Keys
from producer.top import build_snapshot, render
from producer.top.snapshot import StepCostView
from worker.engine.block_manager import BlockManager
from worker.engine.config import SchedulerConfig
from worker.engine.scheduler import Scheduler
from worker.engine.step_cost import PRIOR, StepFeatures
from worker.service.reporting import step_cost_fields


def beat(client: redis.Redis, keys: Keys, info: WorkerInfo) -> None:
    client.hset(keys.worker(info.name), mapping=info.to_hash())  # type: ignore[arg-type]
    client.zadd(keys.workers, {info.name: info.heartbeat_at})


def test_the_worker_reports_every_step_cost_field_of_the_heartbeat() -> None:
    scheduler = Scheduler(SchedulerConfig(), BlockManager(8, 4))
    scheduler.step_cost.observe(StepFeatures(8, 0, 800), 0.07)
    fields = step_cost_fields(scheduler)
    declared = {n for n in WorkerInfo.model_fields if n.startswith("step_")} | {"tpot_targets"}
    assert fields.keys() == declared  # every StepCost term has its heartbeat field, and back
    assert fields["step_measured_s"] == 0.07
    assert fields["step_predicted_s"] == PRIOR.predict_s(StepFeatures(8, 0, 800))
    assert fields["step_base_s"] == scheduler.step_cost.last_fit.base_s
    assert fields["tpot_targets"] == "interactive=150" and fields["step_target_s"] == 0.0


def test_top_shows_the_fit_the_last_step_and_the_targets(client: redis.Redis, keys: Keys) -> None:
    now = time.time()
    terms = {f"step_{f.name}": getattr(PRIOR, f.name) for f in dataclasses.fields(PRIOR)}
    reported = WorkerInfo(
        name="w-a",
        heartbeat_at=now,
        max_num_seqs=8,
        step_measured_s=0.212,
        step_predicted_s=0.205,
        step_target_s=0.15,
        tpot_targets="interactive=150",
        **terms,
    )
    beat(client, keys, reported)
    beat(client, keys, WorkerInfo(name="w-old", heartbeat_at=now, max_num_seqs=4))  # says none
    snap = build_snapshot(client, keys, now_s=now)
    a, old = snap.workers
    assert old.step_cost is None
    assert a.step_cost == StepCostView(
        0.04, 0.0015, 0.00075, 6e-6, 0.212, 0.205, 0.15, "interactive=150"
    )
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


def test_a_worker_without_targets_reports_off() -> None:
    info = WorkerInfo(name="w", step_base_s=0.003, tpot_targets="off")
    view = StepCostView.of(info)
    assert view is not None and view.targets == "off" and view.target_s == 0.0
