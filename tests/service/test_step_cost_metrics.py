"""The step-cost gauges read the scheduler when scraped (no Redis, no model)."""

from __future__ import annotations

import math

from worker.engine.block_manager import BlockManager
from worker.engine.config import SchedulerConfig
from worker.engine.scheduler import Scheduler
from worker.engine.step_cost import PRIOR, StepFeatures
from worker.service.metrics import WorkerMetrics
from worker.service.step_cost_metrics import TERMS


def test_gauges_show_the_fit_the_last_step_and_the_target() -> None:
    scheduler = Scheduler(SchedulerConfig(), BlockManager(8, 4))
    metrics = WorkerMetrics("w1")

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(f"paternoster_{name}", labels)

    assert TERMS == ("base", "per_decode", "per_prefill_token", "per_context_token")
    assert math.isnan(value("step_cost_seconds", term="base") or 0.0)  # no engine yet
    metrics.step_cost.follow(scheduler)
    assert value("step_cost_seconds", term="per_prefill_token") == PRIOR.per_prefill_token_s
    assert value("step_tpot_target_seconds") == 0.0
    f = StepFeatures(4, 0, 400)
    scheduler.step_cost.observe(f, 0.02)
    fitted = scheduler.step_cost.cost  # the loop refits; the scrape reads what it left
    assert value("step_cost_seconds", term="base") == fitted.base_s < PRIOR.base_s
    assert value("step_measured_seconds") == 0.02
    assert value("step_predicted_seconds") == PRIOR.predict_s(f)
