"""One request's state inside the engine: its tokens, how many are computed, its blocks."""

from __future__ import annotations

import enum
import itertools

# One finish reason from the engine to the stream: the protocol's (ABORT and ERROR are the
# engine's own; a request that failed inside a step is ERROR, ``step_faults``).
from producer.status import FinishReason as FinishReason
from worker.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # not admitted, or preempted and waiting to recompute
    RUNNING = "running"  # holds blocks; scheduled every step until it finishes
    FINISHED = "finished"


# A token sampled by a step still in flight (the overlapped loop, `overlap.py`): it holds the
# sequence's place, so the next step can be scheduled before the id reaches the host; the runner
# reads the id on the device (`ModelRunner.run`), and the resolve writes it here. Never a
# vocabulary id, and never inside a computed block (its position is computed by the next step,
# whose `Scheduler.update` runs after the resolve).
PLACEHOLDER = -1

# Unique over the process: the n choices of one request share a request id, so the runner's rows
# are matched back to sequences by this number.
_seq_ids = itertools.count()


class Sequence:
    """Prompt + output tokens, and ``num_computed_tokens`` catching up to ``num_tokens``.

    There are no prefill and decode phases: a step computes ``num_scheduled_tokens`` more tokens,
    and when the sequence has caught up it samples one. A preempted sequence drops its KV
    (``num_computed_tokens = 0``) and later recomputes prompt + output the same way, starting
    after whatever prefix the block manager still has cached.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_index: int,
        *,
        index: int = 0,
        cache_salt: str | None = None,
        priority: int = 0,
        tenant: str = "default",
    ) -> None:
        self.request_id = request_id
        self.seq_id = next(_seq_ids)
        self.index = index  # which of the request's params.n choices this is
        self.params = params
        self.arrival_index = arrival_index
        self.priority = priority  # lower is more urgent
        self.tenant = tenant  # whose fair share it draws on
        self.cache_salt = cache_salt  # only sequences with the same salt share cached blocks
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        # A tuple, replaced when it grows (once per block_size tokens): a step's decision holds
        # it as it is, where a list had to be copied for each row each step.
        self.block_ids: tuple[int, ...] = ()
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.num_preemptions = 0
        self.num_priority_preemptions = 0  # of num_preemptions, those to make room for urgency
        # Order of the last admission: the most recently started sequence is preempted first.
        self.start_index = -1
        self.num_prompt_tokens_charged = 0  # prompt tokens already charged to the tenant
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache at first admission
        # Chained digests of the full blocks of token_ids, memoised by the prefix cache; they
        # depend only on the tokens and the salt, so they survive preemption.
        self.block_digests: list[bytes] = []

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def drop_placeholders(self) -> None:
        """Forget the tokens still in flight (they sit at the end): the sequence ended
        before they arrived, so its outputs count only the tokens it has."""
        ids = self.token_ids
        while len(ids) > self.num_prompt_tokens and ids[-1] == PLACEHOLDER:
            ids.pop()

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, "
            f"computed={self.num_computed_tokens}/{self.num_tokens}, blocks={self.block_ids})"
        )
