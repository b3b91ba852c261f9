"""The online step-cost model: its prior, its fit, how it follows the machine, how it is fed."""

from __future__ import annotations

import random
from dataclasses import astuple

import pytest

from worker.engine.scheduler_output import ScheduledSequence, SchedulerOutput
from worker.engine.step_cost import (
    HALF_LIFE_STEPS,
    PRIOR,
    StepCost,
    StepCostModel,
    StepFeatures,
    StepTimer,
)

MACHINE = StepCost(
    base_s=0.010, per_decode_s=0.002, per_prefill_token_s=0.0005, per_context_token_s=2e-6
)


def random_steps(n: int, seed: int = 0) -> list[StepFeatures]:
    rng = random.Random(seed)
    steps = []
    for _ in range(n):
        decodes = rng.randint(0, 64)
        prefill = rng.choice([0, 0, rng.randint(2, 512)])
        context = decodes * rng.randint(10, 2000) + prefill + rng.randint(0, 1000)
        steps.append(StepFeatures(decodes, prefill, context))
    return steps


def test_before_any_step_the_prior_holds() -> None:
    model = StepCostModel()
    assert model.cost == PRIOR and model.num_steps == 0
    f = StepFeatures(8, 512, 8 * 100 + 512)
    assert model.predict_s(f) == pytest.approx(0.040 + 8 * 0.0015 + 512 * 0.00075 + 1312 * 6e-6)


def test_it_fits_the_machine_from_its_steps() -> None:
    model = StepCostModel()
    for f in random_steps(300):
        model.observe(f, MACHINE.predict_s(f))
    for f in random_steps(50, seed=1):
        assert model.predict_s(f) == pytest.approx(MACHINE.predict_s(f), rel=0.02)
    assert model.cost.per_prefill_token_s == pytest.approx(MACHINE.per_prefill_token_s, rel=0.02)


def test_it_follows_the_machine_when_it_slows_down() -> None:
    model = StepCostModel()
    slow = StepCost(*(2 * c for c in (0.010, 0.002, 0.0005, 2e-6)))
    for f in random_steps(200):
        model.observe(f, MACHINE.predict_s(f))
    f = StepFeatures(16, 256, 16 * 500 + 256)
    for g in random_steps(6 * HALF_LIFE_STEPS, seed=2):  # a neighbour's load doubles each step
        model.observe(g, slow.predict_s(g))
    assert model.predict_s(f) == pytest.approx(slow.predict_s(f), rel=0.01)


def test_a_term_the_steps_say_nothing_about_scales_with_the_machine() -> None:
    model = StepCostModel()
    third = StepCost(*(c / 3 for c in astuple(PRIOR)))  # a machine 3x faster than the prior
    decode_only = [StepFeatures(f.num_decodes, 0, f.num_context_tokens) for f in random_steps(50)]
    model.observe(decode_only[0], third.predict_s(decode_only[0]))
    # One decode step: every term, prefill included, is a third of the prior's.
    assert model.cost.per_prefill_token_s == pytest.approx(third.per_prefill_token_s, rel=0.01)
    for f in decode_only:
        model.observe(f, third.predict_s(f))
    assert model.cost.per_prefill_token_s == pytest.approx(third.per_prefill_token_s, rel=0.01)


def test_coefficients_never_go_negative() -> None:
    model = StepCostModel()
    for f in random_steps(200):  # steps that get faster with more decodes: noise, not physics
        model.observe(f, max(0.001, 0.2 - 0.003 * f.num_decodes))
    assert all(c >= 0 for c in (model.cost.per_decode_s, model.cost.per_context_token_s))


def test_last_step_and_its_prediction_are_kept_for_the_metrics() -> None:
    model = StepCostModel()
    f = StepFeatures(4, 0, 400)
    model.observe(f, 0.5)
    assert model.last_step_s == 0.5 and model.last_predicted_s == pytest.approx(PRIOR.predict_s(f))


def _item(num_computed: int, num_new: int) -> ScheduledSequence:
    return ScheduledSequence("r", tuple(range(num_new)), num_computed, (0,), True)


def test_features_of_a_step_count_decodes_prefill_and_context() -> None:
    f = StepFeatures.of([_item(99, 1), _item(9, 1), _item(1536, 512)])
    assert f == StepFeatures(num_decodes=2, num_prefill_tokens=512, num_context_tokens=2158)
    step = SchedulerOutput((_item(99, 1), _item(9, 1), _item(1536, 512)), 514, ())
    assert StepFeatures.of_step(step) == f  # from the counts the step keeps


def test_the_timer_feeds_the_interval_between_schedules_but_not_an_idle_one() -> None:
    model = StepCostModel()
    timer = StepTimer(model)
    step = SchedulerOutput((_item(10, 1), _item(0, 20)), 21, ())
    timer.begin(0.0, busy=False)
    timer.planned(step, 0.0)
    timer.begin(0.25, busy=True)
    assert model.num_steps == 1 and model.last_step_s == 0.25
    timer.planned(step, 0.25)
    timer.begin(9.0, busy=False)  # everything finished: the engine may have idled
    timer.planned(SchedulerOutput((), 0, ()), 9.0)  # nothing to run: no step to time
    timer.begin(9.5, busy=True)
    assert model.num_steps == 1


def test_the_fit_solves_as_numpy_does_also_where_rows_must_swap() -> None:
    import numpy as np

    from worker.engine.step_cost import _solve

    rng = np.random.default_rng(0)
    for _ in range(20):
        a = rng.normal(size=(4, 4))
        a[0, 0] = 1e-12  # a zero pivot unless the rows are swapped
        b = rng.normal(size=4)
        assert _solve(a.tolist(), b.tolist()) == pytest.approx(np.linalg.solve(a, b), rel=1e-9)
