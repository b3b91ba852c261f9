"""The default TPOT targets leave an offline run (every request priority 0) as it was."""

from __future__ import annotations

import dataclasses
from typing import Any

from tests.engine.sched_clock import TimedHarness
from worker.engine.step_cost import PRIOR, StepCost

# The loaded 2-core EPYC of tpot_burst.py (~5 ms a prefill token): where a target binds.
SLOW = StepCost(*(6.7 * term for term in dataclasses.astuple(PRIOR)))


def offline_steps(**policy: Any) -> tuple[int, float]:
    """Steps and simulated seconds of 4 long prompts and 12 short ones with long outputs, all
    priority 0 and added at once, as LLMEngine.generate adds them."""
    h = TimedHarness(1024, 16, 16, 512, machine=SLOW, **policy)
    for i in range(16):
        h.add(1000 if i % 4 == 0 else 40, 8 if i % 4 == 0 else 60)
    steps = 0
    while h.seqs:
        h.step()
        steps += 1
    return steps, h.clock.now_s


def test_the_default_targets_plan_an_offline_run_as_no_targets_do() -> None:
    off = offline_steps(tpot_target_ms={})
    assert offline_steps() == off  # the defaults: interactive only
    # A default-band target would bind here: prefill cut to fit the decodes' 400 ms.
    steps, seconds = offline_steps(tpot_target_ms={"default": 400.0})
    assert steps > off[0] and seconds > off[1]
