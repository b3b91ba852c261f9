"""The step being scheduled: the tokens each sequence computes in it, and what is left."""

from __future__ import annotations

from worker.engine.scheduler_output import ScheduledSequence
from worker.engine.sequence import Sequence


class StepPlan:
    """Tokens planned per sequence, in planning order, and their running sum.

    The sum is kept rather than recomputed per sequence: re-summing the plan for each of 256
    decodes was quadratic in the batch (32k additions a step). ``decodes``: the rows of the
    step's first pass (`Scheduler._plan_decodes`), built as they were planned (they are the
    plan's first entries); ``dropped``: the sequences dropped since, by id.
    """

    def __init__(self, token_budget: int) -> None:
        self.token_budget = token_budget
        self.tokens: dict[Sequence, int] = {}
        self.num_tokens = 0
        self.decodes: list[ScheduledSequence] = []
        self.dropped: set[int] = set()

    @property
    def tokens_left(self) -> int:
        return self.token_budget - self.num_tokens

    def add(self, seq: Sequence, num_tokens: int) -> None:
        self.tokens[seq] = num_tokens
        self.num_tokens += num_tokens

    def drop(self, seq: Sequence) -> None:
        """Undo ``seq``'s share (preempted after it was planned); a no-op if it had none."""
        if seq in self.tokens:
            self.num_tokens -= self.tokens.pop(seq)
            self.dropped.add(seq.seq_id)

    def built_decodes(self) -> list[ScheduledSequence]:
        """The first pass's rows still planned: the first entries of ``tokens``."""
        if not self.dropped:
            return self.decodes
        dropped = self.dropped
        return [item for item in self.decodes if item.seq_id not in dropped]
