"""What the worker thinks a step costs, on /metrics: the step-cost model's terms, its last
prediction beside the measured step, and the TPOT target the last step was sized to
(``worker/engine/step_cost.py``, ``step_targets.py``).

``WorkerMetrics`` registers these gauges with the rest (docs/metrics.md lists them all), NaN
until the worker points them at its engine's scheduler (``follow``). They read the scheduler
when scraped (``set_function``): plain attribute reads of values the model loop replaces whole,
so the scrape thread never refits or sees half an update.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Gauge

from worker.engine.step_cost import StepCost

if TYPE_CHECKING:
    from worker.engine.scheduler import Scheduler

# The model's terms by label: base_s -> "base", per_decode_s -> "per_decode", ...
TERMS = tuple(f.name.removesuffix("_s") for f in dataclasses.fields(StepCost))


class StepCostGauges:
    """The step-cost gauges on ``registry`` (a ``WorkerMetrics``'), under ``namespace``."""

    def __init__(self, registry: CollectorRegistry, namespace: str) -> None:
        self.scheduler: Scheduler | None = None
        terms = Gauge(
            f"{namespace}_step_cost_seconds",
            "Fitted step-cost terms: seconds a step, a decode, a prefill token, a context token.",
            ["term"],
            registry=registry,
        )
        for term in TERMS:
            terms.labels(term=term).set_function(self._reader(f"{term}_s"))
        gauges: dict[str, tuple[str, Callable[[Scheduler], float]]] = {
            "step_measured_seconds": ("The last timed step.", lambda s: s.step_cost.last_step_s),
            "step_predicted_seconds": (
                "What the model predicted for the last timed step before it ran.",
                lambda s: s.step_cost.last_predicted_s,
            ),
            "step_tpot_target_seconds": (
                "The TPOT target the last step's prefill was sized to; 0: none (whole budget).",
                lambda s: a.target_s if (a := s.last_allowance) is not None else 0.0,
            ),
        }
        for name, (doc, read) in gauges.items():
            Gauge(f"{namespace}_{name}", doc, registry=registry).set_function(self._read(read))

    def follow(self, scheduler: Scheduler) -> None:
        """Read ``scheduler`` (the engine's) from now on."""
        self.scheduler = scheduler

    def _read(self, read: Callable[[Scheduler], float]) -> Callable[[], float]:
        return lambda: math.nan if self.scheduler is None else float(read(self.scheduler))

    def _reader(self, field: str) -> Callable[[], float]:
        return self._read(lambda s: getattr(s.step_cost.last_fit, field))
