"""Batch rows per step while more urgent work is about: bound the step a new chat waits for.

A job that reaches the engine while a step runs waits for that step before its own first-token
step (``first_token.py`` keeps that one short). On the CPU a step's time grows with its rows:
SmolLM2-135M Q4_1 on one thread (CPU time, median of 6): 8 decode rows 32.7 ms, 4 rows 23.9,
1 row 20.2, a chat's 5-token prefill 25.7; so a chat that lands just after an 8-row batch step
began waits 1.3 of its own steps before its first. With ``max_rows`` set, while a job of a
band more urgent than batch runs in the engine, or ran there less than ``HOLD_S`` ago, a step
plans at most ``max_rows`` batch-band decodes: the others stay running with their KV blocks,
and those left out longest go first in the next steps, so every batch row progresses.

Off by default (0): on a GPU a step's time barely grows with its rows, and a cap would only
cost batch throughput. Never without more urgent work about: batch-only and offline runs plan
exactly what they planned before. Prefill chunks of batch prompts are not capped.
"""

from __future__ import annotations

import math

from producer.keys import BAND_FLOORS
from worker.engine.sequence import Sequence

BATCH_FLOOR = BAND_FLOORS["batch"]  # priorities from here are the batch band's
# How long after the last more urgent job left the engine batch rows stay capped: chats come
# one after another with a round trip between (a client's next request, 2-20 ms here), and
# the one that arrives next must find short steps.
HOLD_S = 1.0


def is_batch(seq: Sequence) -> bool:
    return seq.priority >= BATCH_FLOOR


class BatchRowCap:
    """Which running batch decodes a step leaves out while more urgent work is about."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows  # 0: off
        self._urgent_at = -math.inf  # when a more urgent job was last seen running
        self._planned_at: dict[int, int] = {}  # batch decode seq_id -> step it last ran in
        self._step = 0
        self.num_steps = 0  # steps that left batch rows out, over the scheduler's life

    def split(
        self, running: list[Sequence], head: Sequence | None, now: float
    ) -> tuple[list[Sequence], list[Sequence]]:
        """The running rows this step may plan, and the batch decodes it leaves out (none
        while no more urgent job is about, or with at most ``max_rows`` batch decodes).
        ``head``: the waiting sequence admission looks at first, if the scheduler read it."""
        if self.max_rows == 0:
            return running, []
        self._step += 1
        if (head is not None and not is_batch(head)) or any(not is_batch(s) for s in running):
            self._urgent_at = now
        elif now - self._urgent_at > HOLD_S:
            return running, []
        decodes = [s for s in running if is_batch(s) and s.num_uncomputed_tokens == 1]
        if len(decodes) <= self.max_rows:
            return running, []
        last = self._planned_at
        decodes.sort(key=lambda s: last.get(s.seq_id, 0))  # stable: admission order on ties
        kept, held = decodes[: self.max_rows], decodes[self.max_rows :]
        # Only sequences still decoding are kept in the map: it never outgrows the batch.
        self._planned_at = {s.seq_id: last.get(s.seq_id, 0) for s in held}
        self._planned_at.update((s.seq_id, self._step) for s in kept)
        self.num_steps += 1
        left_out = {s.seq_id for s in held}
        return [s for s in running if s.seq_id not in left_out], held
