"""What a step costs: a linear model of step time, fitted online from the engine's own steps.

A step's time is modelled as

    base_s + per_decode_s * decodes + per_prefill_token_s * prefill tokens
           + per_context_token_s * context tokens

where the context tokens are the K/V positions the step's attention reads, summed over its
sequences (a decode at position 2,000 reads 2,000; a 512-token chunk after 1,536 computed tokens
reads 2,048). The coefficients are a least-squares fit over recent steps, exponentially weighted
(half-life ``HALF_LIFE_STEPS``) so that it follows the machine as its load changes, and pulled
toward a prior (``PRIOR``) so that the first steps, and a term the recent steps say nothing
about (no prefill for a while), keep a sane value: the prior's proportions between the terms,
scaled to the machine by the steps it has seen.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import astuple, dataclass
from typing import NamedTuple

from worker.engine.scheduler_output import ScheduledSequence, SchedulerOutput

# About 10 s of steps on a 2-core CPU (~150 ms a step), well under a second on an H200: long
# enough to average out one slow step, short enough to follow a neighbour's load.
HALF_LIFE_STEPS = 64
# The prior's proportions count as 0.02 of a step (features scaled by ``_SCALE``), its scale as
# 1e-6 of one: the first step sets the scale of every term, also those it did not exercise.
# Measured (test_sched_step_cost.py's steps): 300 steps of a machine whose proportions differ
# from the prior's (base 4x smaller) predict within 1.5% (at 0.2: 14%); one decode step of a
# machine 3x faster than the prior puts its prefill term within 0.2% (with the scale's weight
# at 1e-4 instead: 19%).
PRIOR_WEIGHT_STEPS = 0.02
SCALE_WEIGHT_STEPS = 1e-6


class StepFeatures(NamedTuple):
    """What a step computes, as the model sees it."""

    num_decodes: int
    num_prefill_tokens: int
    num_context_tokens: int  # K/V positions attention reads, summed over the step's sequences

    @classmethod
    def of(cls, scheduled: Iterable[ScheduledSequence]) -> StepFeatures:
        decodes = prefill = context = 0
        for item in scheduled:
            n = item.num_scheduled_tokens
            context += item.num_computed_tokens + n
            if n == 1:
                decodes += 1
            else:
                prefill += n
        return cls(decodes, prefill, context)

    @classmethod
    def of_step(cls, output: SchedulerOutput) -> StepFeatures:
        """``of(output.scheduled)`` from the counts the output keeps: no pass over its rows."""
        decodes = output.num_decodes
        return cls(decodes, output.num_batched_tokens - decodes, output.num_context_tokens)


@dataclass(frozen=True)
class StepCost:
    """The model's coefficients (seconds); ``predict_s`` applies them."""

    base_s: float
    per_decode_s: float
    per_prefill_token_s: float
    per_context_token_s: float

    def predict_s(self, f: StepFeatures) -> float:
        return (
            self.base_s
            + self.per_decode_s * f.num_decodes
            + self.per_prefill_token_s * f.num_prefill_tokens
            + self.per_context_token_s * f.num_context_tokens
        )


# SmolLM2-135M in fp32 on 2 cores of the AVX-512 Xeon (BENCHMARKS.md, CPU throughput at full
# scale): a one-row decode step ~40 ms of projections, ~1.5 ms more per row up to 16 rows, a
# 512-token chunk ~0.4 s (0.75 ms a token), decode attention ~8 GB/s over 46 KB of K/V a token
# (~6 us a context token). A GPU's steps are 10-100x cheaper: the fit gets there within a few
# steps, and until then chunks are only smaller than they need be.
PRIOR = StepCost(
    base_s=0.040, per_decode_s=0.0015, per_prefill_token_s=0.00075, per_context_token_s=6e-6
)
# Typical magnitudes of each term's feature, so the prior weighs about equally on each.
_SCALE = (1.0, 64.0, 512.0, 65536.0)


def _row(f: StepFeatures) -> list[float]:
    return [v / s for v, s in zip((1.0, *f), _SCALE, strict=True)]


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """x with ``a`` x = ``b``: Gaussian elimination with partial pivoting, as LAPACK's solve.
    Plain floats: numpy's per-call overhead made the model's per-step update (this fit
    included) 65 us of a 256-row decode step; 42 us so, the solve 19 of them (2-core Xeon,
    the stubbed step of `host_overhead.py` with each part wrapped in a timer)."""
    n = len(b)
    m = [[*row, bi] for row, bi in zip(a, b, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        top = m[col]
        for row in m[col + 1 :]:
            f = row[col] / top[col]
            for k in range(col, n + 1):
                row[k] -= f * top[k]
    x = [0.0] * n
    for i in range(n - 1, -1, -1):
        row = m[i]
        x[i] = (row[n] - sum(row[k] * x[k] for k in range(i + 1, n))) / row[i]
    return x


class StepCostModel:
    """Exponentially weighted ridge regression of step time on ``StepFeatures``."""

    def __init__(self, prior: StepCost = PRIOR, half_life_steps: float = HALF_LIFE_STEPS) -> None:
        self.prior = prior
        self._decay = 0.5 ** (1.0 / half_life_steps)
        # The prior holds the coefficients' proportions, not their scale: the penalty is on
        # the part of the coefficients off the prior's direction (u), so one step of a machine
        # 10x faster scales every term by 1/10, also the ones that step did not exercise.
        # Along u only a token weight (SCALE_WEIGHT_STEPS) holds the prior until a step comes.
        prior_beta = [c * s for c, s in zip(astuple(prior), _SCALE, strict=True)]  # scaled units
        norm = math.sqrt(sum(c * c for c in prior_beta))
        u = [c / norm for c in prior_beta]
        self._ridge = [
            [
                PRIOR_WEIGHT_STEPS * ((i == j) - ui * uj) + SCALE_WEIGHT_STEPS * ui * uj
                for j, uj in enumerate(u)
            ]
            for i, ui in enumerate(u)
        ]
        self._ridge_rhs = [SCALE_WEIGHT_STEPS * c for c in prior_beta]
        self._xtx = [[0.0] * 4 for _ in range(4)]
        self._xty = [0.0] * 4
        self._cost: StepCost | None = prior
        self.last_fit = prior  # the latest fit; read from other threads (metrics) without refitting
        self.num_steps = 0  # steps observed
        self.last_step_s = 0.0
        self.last_predicted_s = 0.0  # what the model said of that step before it ran

    def observe(self, features: StepFeatures, step_s: float) -> None:
        """One step's measured time."""
        self.last_predicted_s = self.cost.predict_s(features)
        self.last_step_s = step_s
        x, d = _row(features), self._decay
        self._xtx = [
            [d * a + xi * xj for a, xj in zip(row, x, strict=True)]
            for row, xi in zip(self._xtx, x, strict=True)
        ]
        self._xty = [d * a + xi * step_s for a, xi in zip(self._xty, x, strict=True)]
        self.num_steps += 1
        self._cost = None  # refitted when next asked

    @property
    def cost(self) -> StepCost:
        """The current coefficients, each at least 0 (a negative cost would promise room that
        is not there)."""
        if self._cost is None:
            a = [
                [p + q for p, q in zip(row, ridge, strict=True)]
                for row, ridge in zip(self._xtx, self._ridge, strict=True)
            ]
            b = [p + q for p, q in zip(self._xty, self._ridge_rhs, strict=True)]
            beta = _solve(a, b)
            self._cost = self.last_fit = StepCost(
                *(max(c, 0.0) / s for c, s in zip(beta, _SCALE, strict=True))
            )
        return self._cost

    def predict_s(self, features: StepFeatures) -> float:
        return self.cost.predict_s(features)


class StepTimer:
    """Feeds the model the time from one step's schedule to the next's: what the step's decodes'
    users waited for their token (forward, sampling, text, publishing), on either engine loop."""

    def __init__(self, model: StepCostModel) -> None:
        self.model = model
        self._last: tuple[StepFeatures, float] | None = None  # the last step, when it began

    def begin(self, now_s: float, busy: bool) -> float | None:
        """A schedule begins; ``busy``: a sequence kept running since the last one (if not,
        the engine may have idled in between, and the interval is no step's time). The last
        step's time, if it was observed."""
        last, self._last = self._last, None
        if last is None or not busy:
            return None
        features, began_s = last
        step_s = now_s - began_s
        self.model.observe(features, step_s)
        return step_s

    def planned(self, output: SchedulerOutput, now_s: float) -> None:
        if not output.is_empty:
            self._last = (StepFeatures.of_step(output), now_s)
