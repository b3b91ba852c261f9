"""The first-token lane: an interactive job's first token is not held behind less urgent decodes.

On the CPU a step costs what its rows cost, so an interactive prompt admitted into a step with
64 running batch decodes waits for all 64: on the bundled SmolLM2 during a batch, interactive
TTFT p50 was 106.5 ms against 31.8 ms idle (docs/gateway.md). When a sequence of the lane's band
(``LANE_BAND``, interactive) waits for its first token and its prompt (less the prefix the block
manager has cached for it), or its last chunk, fits in this step's token budget, the step
leaves out the running decodes of every less urgent band, default included (default is below
interactive in admission and preemption already), and starts no less urgent prompt. Running
prefill chunks stay: the oldest keeps its minimum chunk (step_targets.py), so a long prompt
still progresses every step. The left-out decodes stay running with their KV blocks, and are
scheduled again on the next step. Under a TPOT target the step's prefill allowance counts the
left-out decodes too, as a step that delivers no first token after all carries them, and
credits their cost to the first token alone (``step_targets``): either way the step stays
under its target.

Bounded: at most ``max_steps`` consecutive steps leave rows out (one lane step per arriving
prompt; a burst of chats cannot stop batch decodes for longer), and a step that did not deliver
a first token after all (no slot, no blocks) plans the left-out rows too. Never taken without
such a waiting first token: batch-only and offline steps are planned as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sized
from operator import attrgetter

from producer.keys import BAND_FLOORS, BANDS
from worker.engine.sequence import Sequence

LANE_BAND = BANDS[0]  # the most urgent band: its first tokens get the lane
_LANE_BELOW = BAND_FLOORS[BANDS[1]]  # priorities under the next band's floor are the lane's
_PRIORITY = attrgetter("priority")


def in_lane(seq: Sequence) -> bool:
    """Whether ``seq`` is of the lane's band (``band_of`` is ``LANE_BAND``)."""
    return seq.priority < _LANE_BELOW


def first_token_fits(seq: Sequence, budget: int, num_cached: int = 0) -> bool:
    """Whether ``seq`` is of the lane's band, has no output token yet, and the rest of its
    prompt, less ``num_cached`` tokens a waiting ``seq`` finds in the prefix cache, fits in
    ``budget`` tokens."""
    if not in_lane(seq) or seq.num_output_tokens > 0:
        return False
    return 0 < seq.num_uncomputed_tokens - num_cached <= budget


def delivers(planned: dict[Sequence, int], of: Callable[[Sequence], bool] = in_lane) -> bool:
    """Whether a planned step computes the last prompt token of a first token of a sequence
    ``of`` accepts (default: the lane's band)."""
    return any(
        of(s) and s.num_output_tokens == 0 and n == s.num_uncomputed_tokens
        for s, n in planned.items()
    )


class FirstTokenLane:
    """Which running rows a step leaves out, and the bound on consecutive such steps."""

    def __init__(self, max_steps: int, num_cached: Callable[[Sequence], int]) -> None:
        self.max_steps = max_steps  # 0: off
        self._num_cached = num_cached  # a waiting sequence's cached prefix (tokens)
        self.streak = 0  # consecutive steps that left rows out
        self.num_steps = 0  # steps that took the lane, over the scheduler's life

    def open(self, waiting: Sized) -> bool:
        """Whether this step may take the lane for one of ``waiting`` (else no head is read)."""
        return self.streak < self.max_steps and len(waiting) > 0

    def split(
        self, running: list[Sequence], head: Sequence | None, budget: int
    ) -> tuple[list[Sequence], list[Sequence]]:
        """The running rows this step plans, and the decodes it leaves out (none: the lane is
        not taken). ``head``: the waiting sequence admission would consider first; ``budget``:
        the step's tokens."""
        if self.streak >= self.max_steps:
            return running, []
        if (head is None or not in_lane(head)) and min(
            map(_PRIORITY, running), default=_LANE_BELOW
        ) >= _LANE_BELOW:
            # No sequence of the lane's band, waiting first or running: no first token to
            # give, whatever the rows. One C-level pass instead of the loop below: 0.021 ->
            # 0.008 ms at 256 rows (thread CPU time, Zen 4; BENCHMARKS.md "thirteenth pass").
            return running, []
        kept: list[Sequence] = []
        held: list[Sequence] = []
        kept_decodes = 0
        for s in running:  # `num_uncomputed_tokens` inlined: read once a row a step
            n = len(s.token_ids) - s.num_computed_tokens
            if n > 1 or in_lane(s):
                kept.append(s)
                kept_decodes += n == 1
            else:
                held.append(s)
        if not held:
            return running, []
        left = budget - kept_decodes
        # Looked up only for a head of the lane's band: a batch head is not hashed for it.
        waiting = (
            head is not None
            and in_lane(head)
            and first_token_fits(head, left, self._num_cached(head))
        )
        if not waiting and not any(first_token_fits(s, left) for s in kept):
            return running, []
        return kept, held

    def record(self, taken: bool) -> None:
        """After the step: whether it left rows out (and delivered a first token)."""
        self.streak = self.streak + 1 if taken else 0
        self.num_steps += taken
