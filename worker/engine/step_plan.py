"""The step being scheduled: the tokens each sequence computes in it, and what is left."""

from __future__ import annotations

from worker.engine.sequence import Sequence


class StepPlan:
    """Tokens planned per sequence, in planning order, and their running sum.

    The sum is kept rather than recomputed per sequence: re-summing the plan for each of 256
    decodes was quadratic in the batch (32k additions a step).
    """

    def __init__(self, token_budget: int) -> None:
        self.token_budget = token_budget
        self.tokens: dict[Sequence, int] = {}
        self.num_tokens = 0

    @property
    def tokens_left(self) -> int:
        return self.token_budget - self.num_tokens

    def add(self, seq: Sequence, num_tokens: int) -> None:
        self.tokens[seq] = num_tokens
        self.num_tokens += num_tokens

    def drop(self, seq: Sequence) -> None:
        """Undo ``seq``'s share (preempted after it was planned); a no-op if it had none."""
        self.num_tokens -= self.tokens.pop(seq, 0)
