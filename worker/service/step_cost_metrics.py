"""What the worker thinks a step costs, on /metrics: the step-cost model's terms, its last
prediction beside the measured step, and the TPOT target the last step was sized to
(``worker/engine/step_cost.py``, ``step_targets.py``).

The gauges read the scheduler when scraped (``set_function``): plain attribute reads of values
the model loop replaces whole, so the scrape thread never refits or sees half an update.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge

from worker.engine.scheduler import Scheduler
from worker.engine.step_cost import StepCost
from worker.service.metrics import NS

# The model's terms by label: base_s -> "base", per_decode_s -> "per_decode", ...
TERMS = tuple(f.name.removesuffix("_s") for f in dataclasses.fields(StepCost))


def export_step_cost(registry: CollectorRegistry, scheduler: Scheduler) -> None:
    """Register the step-cost gauges on ``registry`` (a ``WorkerMetrics.registry``)."""
    terms = Gauge(
        f"{NS}_step_cost_seconds",
        "Fitted step-cost terms: seconds a step, a decode, a prefill token, a context token.",
        ["term"],
        registry=registry,
    )
    for term in TERMS:
        terms.labels(term=term).set_function(_term_reader(scheduler, f"{term}_s"))
    gauges = {
        "step_measured_seconds": ("The last timed step.", lambda: scheduler.step_cost.last_step_s),
        "step_predicted_seconds": (
            "What the model predicted for the last timed step before it ran.",
            lambda: scheduler.step_cost.last_predicted_s,
        ),
        "step_tpot_target_seconds": (
            "The TPOT target the last step's prefill was sized to; 0: none (whole budget).",
            lambda: a.target_s if (a := scheduler.last_allowance) is not None else 0.0,
        ),
    }
    for name, (doc, read) in gauges.items():
        Gauge(f"{NS}_{name}", doc, registry=registry).set_function(read)


def _term_reader(scheduler: Scheduler, field: str) -> Callable[[], float]:
    def read() -> float:
        return float(getattr(scheduler.step_cost.last_fit, field))

    return read
