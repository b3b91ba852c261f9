"""Budget-aware constrained decoding: a constrained row finishes its structure inside its budget.

A row's budget is the tokens it may still take: ``max_tokens`` or the model's length, whichever
ends it first. While the budget is ample nothing changes. From ``FIRST_CHECK_TOKENS`` left, the
row's matcher is asked how many tokens the structure still needs to be complete
(``Matcher.closing``, a bounded search: ~0.5 ms, 10 ms at worst on 2 cores), on a schedule that
halves the slack between checks, so a row checks about ten times in its last 128 tokens and a
row that ends before then never. Once the slack (budget - tokens needed - the stop token) is at
most ``MARGIN``, the row is closing: each step allows only the next token of that closing path,
then only a stop token, so the output ends ``stop``, complete, within the budget, instead of
being cut ``length`` mid-string (issue 20: SmolLM2-135M at 0.7 looped inside Book's unbounded
``subtitle`` past 2,048 tokens).

Decisions are a function of the tokens alone: a resumed run replays them with its matcher
(``RowState.catch_up``) and so decides what the first run did at each position; a preempted row
keeps its closer. A row that cannot finish within its budget is left alone and ends ``length``.
"""

from __future__ import annotations

from typing import Protocol

# Allow only the stop tokens (the structure is complete).
STOPS = -1
# Budget left at the first check: a closing path of the ten benchmark shapes from a loop inside a
# string or a number is under 30 tokens (``tests/engine/test_grammar_closing.py``), so 128 is
# ample, and a row that ends with more than 128 tokens unused costs nothing.
FIRST_CHECK_TOKENS = 128
# Slack tolerated before closing: one free token may add this much to the need (a backslash
# opens an escape, a token may end inside a multi-byte character) and still fit.
MARGIN = 2
# After a search that found no way (the structure needs more than the budget, or the state
# accepts no ASCII next), checks wait this many tokens, or a quarter of the budget if more: a
# failed search costs up to ~50 ms.
_RETRY_TOKENS = 4


class Closing(Protocol):
    def closing(self, limit: int) -> list[int] | None: ...


class BudgetCloser:
    """One constrained row's closing schedule and, once closing, its path."""

    def __init__(self) -> None:
        self._next_check = FIRST_CHECK_TOKENS  # check once the budget is at most this
        self._slack: int | None = None  # at the last check that found a way
        self._plan: list[int] | None = None  # closing: the tokens still to force
        self._position = -1  # the sequence position decided last, and its decision
        self._decision: int | None = None

    @property
    def closing(self) -> bool:
        return self._plan is not None

    def decide(self, matcher: Closing, position: int, budget: int) -> int | None:
        """What may be sampled at sequence ``position`` with ``budget`` tokens left (this one
        included): None for whatever the grammar allows, a token id, or ``STOPS``. Decided once
        per position, in order; asked again, the same answer."""
        if position == self._position:
            return self._decision
        if position != self._position + 1 and self._position >= 0:
            self._plan = None  # a gap: the path may not hold from here
        self._position = position
        self._decision = self._next(matcher, budget)
        return self._decision

    def taken(self, token_id: int) -> None:
        """The row took ``token_id`` at the position decided last. A resumed run's tokens need
        not be what this closer would force (an older build wrote them): then it plans again."""
        if self._decision is not None and self._decision != token_id:
            self._plan, self._next_check = None, 1 << 30

    def _next(self, matcher: Closing, budget: int) -> int | None:
        if self._plan is not None:
            return self._plan.pop(0) if self._plan else STOPS
        if budget > self._next_check or budget < 1:
            return None
        tokens = matcher.closing(budget - 1)  # the last token of the budget is the stop token
        if tokens is None:
            near = self._slack is not None and self._slack <= 2 * MARGIN
            self._next_check = budget - (1 if near else max(_RETRY_TOKENS, budget // 4))
            return None
        slack = budget - 1 - len(tokens)
        self._slack = slack
        if slack > MARGIN:
            self._next_check = budget - max(1, (slack - MARGIN) // 2)
            return None
        self._plan = tokens
        return self._plan.pop(0) if self._plan else STOPS
