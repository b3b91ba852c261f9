"""The one object the scheduler hands the model runner each step."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from worker.engine.sequence import Sequence


@dataclass(frozen=True)
class ScheduledSequence:
    """One sequence's share of a step: which tokens to compute, where their K/V go."""

    request_id: str
    token_ids: tuple[int, ...]  # the num_scheduled_tokens tokens computed this step
    num_computed_tokens: int  # tokens already in the cache: the first new token's position
    block_ids: tuple[int, ...]  # the sequence's block table, covering every new token
    samples: bool  # True when this step reaches num_tokens, so one token is sampled
    # Which sequence: the n choices of one request share its request id. The runner echoes it.
    seq_id: int = 0

    @property
    def num_scheduled_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def is_decode(self) -> bool:
        return len(self.token_ids) == 1


@dataclass(frozen=True)
class SchedulerOutput:
    """A step's decision. Sequences are ordered decodes first, then prefill chunks."""

    scheduled: tuple[ScheduledSequence, ...]
    num_batched_tokens: int  # sum of num_scheduled_tokens; never above the step budget
    preempted_ids: tuple[str, ...]  # sequences whose blocks were freed this step

    @classmethod
    def build(
        cls, planned: Iterable[tuple[Sequence, int]], preempted: Iterable[Sequence]
    ) -> SchedulerOutput:
        """The step for ``planned`` (sequence, tokens to compute), decodes first."""
        planned = list(planned)
        items = [
            ScheduledSequence(
                request_id=seq.request_id,
                token_ids=tuple(
                    seq.token_ids[seq.num_computed_tokens : seq.num_computed_tokens + n]
                ),
                num_computed_tokens=seq.num_computed_tokens,
                block_ids=tuple(seq.block_ids),
                samples=seq.num_computed_tokens + n == seq.num_tokens,
                seq_id=seq.seq_id,
            )
            for seq, n in planned
        ]
        items.sort(key=lambda s: not s.is_decode)  # stable: decodes first, in running order
        return cls(
            scheduled=tuple(items),
            num_batched_tokens=sum(n for _, n in planned),
            preempted_ids=tuple(s.request_id for s in preempted),
        )

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def num_decodes(self) -> int:
        return sum(1 for s in self.scheduled if s.is_decode)
