"""A request's other choices (``params.n > 1``), held until its first choice has computed the
prompt: then they start from its cached blocks, and the prompt is computed once, not n times."""

from __future__ import annotations

from worker.engine.sequence import Sequence


class HeldForks:
    """Held choices, keyed by their request's first choice."""

    def __init__(self) -> None:
        self._forks: dict[Sequence, list[Sequence]] = {}

    def hold(self, first: Sequence, forks: list[Sequence]) -> None:
        self._forks[first] = forks

    def release(self, first: Sequence) -> list[Sequence]:
        """``first``'s held choices, no longer held (none if it has none)."""
        return self._forks.pop(first, [])

    def discard(self, seq: Sequence) -> bool:
        """Stop holding choice ``seq``; False if it was not held."""
        for forks in self._forks.values():
            if seq in forks:
                forks.remove(seq)
                return True
        return False

    def held(self) -> list[Sequence]:
        return [s for forks in self._forks.values() for s in forks]

    def __len__(self) -> int:
        return sum(len(forks) for forks in self._forks.values())

    def __bool__(self) -> bool:
        return bool(self._forks)
