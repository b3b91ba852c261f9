"""A scheduler harness on a fake clock that a known step cost advances (targets and aging)."""

from __future__ import annotations

from typing import Any

from tests.engine.sched_helpers import Harness
from worker.engine.scheduler import Scheduler
from worker.engine.scheduler_output import SchedulerOutput
from worker.engine.step_cost import StepCost, StepCostModel, StepFeatures, StepTimer


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class TimedHarness(Harness):
    """Each step takes ``machine``'s cost of it (or ``step_s`` when given) on the fake clock;
    the scheduler's cost model starts from ``prior`` (default: the machine's)."""

    def __init__(
        self,
        *args: Any,
        machine: StepCost | None = None,
        prior: StepCost | None = None,
        step_s: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.clock = FakeClock()
        self.machine = machine
        self.step_s = step_s
        self.scheduler = Scheduler(self.config, self.bm, clock=self.clock)
        start = prior or machine
        if start is not None:
            self.scheduler.step_cost = model = StepCostModel(prior=start)
            self.scheduler._timer = StepTimer(model)

    def step(self) -> SchedulerOutput:
        out = super().step()
        if self.step_s is not None:
            self.clock.now_s += self.step_s
        elif self.machine is not None:
            self.clock.now_s += self.machine.predict_s(StepFeatures.of(out.scheduled))
        return out
