"""Batch work per step while more urgent work is about: bound the step a new chat waits for.

A job that reaches the engine while a step runs waits for that step before its own first-token
step (``first_token.py`` keeps that one short). On the CPU a step's time grows with its rows:
SmolLM2-135M Q4_1 on one thread of a 2-core AMD EPYC, a one-row decode step took 12.9 ms, 8 rows
30.3, 64 rows 232, and a prompt ~3.5 ms more a token (``ops/bench/step_rows.py --threads 1``).
A chat landing in a 64-row batch step waited up to that step for a
first token it got in ~30 ms idle: interactive TTFT p99 during a batch was 4.5-5x idle.

So while a job of a band more urgent than batch runs in the engine, waits at the head of its
queue, or ran there less than ``HOLD_S`` ago, batch-band work (running decodes, prefill chunks,
new batch prompts) is planned after the more urgent work and only up to ``units`` rows and
prompt tokens a step; and a step that gives a more urgent job its first token carries no batch
work at all (at most ``FIRST_TOKEN_STEPS`` such steps in a row). ``units`` is steered by the
measured time of the steps that carried batch work, toward ``slowdown_max`` times
``reference_s``: the measured time of bounded steps that carried more urgent work and no batch
work (what a chat's own step costs on this machine, now). Measured, not modelled: steps held
near one size make the step cost model's fixed and per-row terms indistinguishable (its fit put
a one-row step at 45-57 ms against 12.9 measured, and a bound derived from it grew with it).
Until a reference step is measured, ``units`` stays at ``INITIAL_UNITS``. Batch decodes left out
longest go first (every batch row progresses; none is preempted: they keep their KV blocks),
and ``units`` never falls under 1: every other step plans at least one batch row or prompt token,
so batch work never starves behind a stream of chats.

The bound is relative to the machine's own steps: where a step costs little more with more rows
(an H200 ran Llama-3.2-1B's shape at 1.17 ms a step at 1 row, 1.62 at 64), ``units`` grows until
only what lengthens the step well past a chat's own (long chunks of batch prompts) is cut.
Never without more urgent work about: batch-only and offline runs plan what they planned before.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from operator import attrgetter

from producer.keys import BAND_FLOORS
from worker.engine.first_token import delivers
from worker.engine.sequence import Sequence

BATCH_FLOOR = BAND_FLOORS["batch"]  # priorities from here are the batch band's
_PRIORITY = attrgetter("priority")
# How long after the last more urgent job left the engine batch work stays bounded: the next
# chat must find short steps, and chats reach each worker apart. At 1 s, two workers sharing a
# stream of back-to-back probes (one every ~0.35 s in all) each went past a second without one
# now and then, planned a 40-row step, and the probe landing in it waited 190 ms (p99 3.4x
# idle, ops/bench/batch_api.py). Bounded steps cost batch work ~25% of its rate.
HOLD_S = 10.0
# The batch units of the first bounded step: 8 rows cost 2.3 one-row steps on the CPU above.
INITIAL_UNITS = 8.0
# Per measured step a reference step weighs 0.25 (half-life ~2.4 steps: a chat's own steps are
# few). Units move by target / measured: for a step costing a + b * rows (a > 0) that never
# overshoots the rows that meet the target, from either side, and a step with the base alone
# (a GPU's) grows them by that ratio per step.
REFERENCE_WEIGHT = 0.25
# Consecutive steps that may leave all batch work out to deliver a more urgent first token: two
# chats arriving together both get one; batch work then runs at least every third step.
FIRST_TOKEN_STEPS = 2


def is_batch(seq: Sequence) -> bool:
    return seq.priority >= BATCH_FLOOR


def is_urgent(seq: Sequence) -> bool:
    """Of a band more urgent than batch."""
    return seq.priority < BATCH_FLOOR


class BatchBound:
    """How much batch-band work a step plans while more urgent work is about."""

    def __init__(self, slowdown_max: float, max_units: int) -> None:
        self.slowdown_max = slowdown_max  # 0: off
        self.max_units = max_units  # the step's token budget: units never need more
        self.units = INITIAL_UNITS  # batch rows and prompt tokens a bounded step plans
        self.reference_s: float | None = None  # measured: a step of urgent work, no batch work
        self._urgent_at = -math.inf  # when a more urgent job was last seen in the engine
        self._planned_at: dict[int, int] = {}  # batch decode seq_id -> step it last ran in
        self._step = 0
        self.active = False  # this step bounds batch work
        self._left = 0  # units this step may still plan
        self._streak = 0  # consecutive bounded steps that left batch work out for a first token
        self._last: tuple[bool, int] | None = None  # the last step: (urgent work, batch units)
        self.num_steps = 0  # steps that left batch work out, over the scheduler's life

    def observe(self, step_s: float) -> None:
        """The last planned step took ``step_s``: it refines the reference or steers units."""
        if self._last is None:
            return
        urgent, batch_units = self._last
        self._last = None
        ref = self.reference_s
        if urgent and batch_units == 0:
            self.reference_s = step_s if ref is None else ref + REFERENCE_WEIGHT * (step_s - ref)
        elif batch_units > 0 and ref is not None:
            ratio = self.slowdown_max * ref / step_s
            # Fewer units planned than allowed say nothing of more: grow only from the limit.
            grown = max(batch_units * ratio, self.units) if ratio > 1 else batch_units * ratio
            self.units = min(max(grown, 1.0), float(self.max_units))

    def begin(
        self, running: list[Sequence], head: Sequence | None, batch_waiting: bool, now: float
    ) -> bool:
        """Whether this step bounds batch work: a more urgent job is about (``head``: the
        waiting sequence admission looks at first, if the scheduler read it), and batch work
        runs or waits (``batch_waiting``); offline runs, with no batch band, pay no more passes."""
        self._step += 1
        self.active = False
        self._last = None  # observed only while bounding
        if self.slowdown_max == 0:
            return False
        if (head is not None and is_urgent(head)) or any(is_urgent(s) for s in running):
            self._urgent_at = now
        elif now - self._urgent_at > HOLD_S:
            return False
        # C-level: 0.013 -> 0.008 ms at 256 rows of no batch work against `any(is_batch(s) ...)`.
        self.active = batch_waiting or max(map(_PRIORITY, running), default=0) >= BATCH_FLOOR
        return self.active

    def split(self, rows: list[Sequence]) -> tuple[list[Sequence], list[Sequence]]:
        """``rows`` less their batch rows, and those batch rows (all in ``rows``' order), which
        the step plans after the rest, under the bound; ``rows`` itself while not bounding."""
        if not self.active:
            return rows, []
        return [s for s in rows if is_urgent(s)], [s for s in rows if is_batch(s)]

    def order(self, bounded: list[Sequence]) -> list[Sequence]:
        """The order batch rows are granted in: decodes first, those left out longest first
        (list order on ties), then prefill chunks in list order."""
        last = self._planned_at
        return sorted(bounded, key=lambda s: (s.num_uncomputed_tokens > 1, last.get(s.seq_id, 0)))

    def open(self, planned: dict[Sequence, int]) -> bool:
        """Start granting this step's units (at least one: batch work never starves) after the
        more urgent work in ``planned``; False: this step plans no batch work (it delivers a
        more urgent first token)."""
        if self._streak < FIRST_TOKEN_STEPS and delivers(planned, of=is_urgent):
            self._streak += 1
            return False
        self._streak = 0
        self._left = int(self.units)
        return True

    def grant(self, seq: Sequence, wanted: int) -> int:
        """Tokens of batch ``seq``'s next ``wanted`` that fit under the bound (0: none)."""
        return min(wanted, max(self._left, 0))

    def spend(self, seq: Sequence, num_tokens: int) -> None:
        """Batch ``seq`` was planned ``num_tokens`` (its computed tokens not yet moved)."""
        self._left -= num_tokens
        if num_tokens == 1 and seq.num_uncomputed_tokens == 1:
            self._planned_at[seq.seq_id] = self._step

    def close(self, planned: dict[Sequence, int], bounded: Iterable[Sequence]) -> None:
        """After a bounded step is planned: what it carried (for ``observe``), and rotation
        entries kept only for rows still decoding."""
        batch_units = sum(n for s, n in planned.items() if is_batch(s))
        self._last = (any(is_urgent(s) for s in planned), batch_units)
        left_out = False
        keep: dict[int, int] = {}
        for seq in bounded:
            if seq.num_uncomputed_tokens == 1:
                keep[seq.seq_id] = self._planned_at.get(seq.seq_id, 0)
            left_out = left_out or seq not in planned
        self._planned_at = keep  # only rows still decoding: never outgrows the batch
        self.num_steps += left_out
