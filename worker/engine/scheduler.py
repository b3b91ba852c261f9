"""Iteration-level scheduling: every step, who computes how many tokens.

Each step spends two budgets: ``max_num_seqs`` sequences and ``max_num_batched_tokens`` tokens.
Running decodes go first (one token each) so a long prompt never stalls them; then running
sequences still prefilling get chunks; then waiting sequences are admitted in arrival order.
When a running sequence needs a block and none is free, the most recently admitted running
sequence is preempted (blocks freed, requeued at the front, recomputed later). A sequence being
admitted starts after the longest prefix the block manager has cached for it.
The scheduler decides and never touches tensors.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from worker.engine.block_manager import BlockManager
from worker.engine.config import SchedulerConfig
from worker.engine.scheduler_output import ScheduledSequence, SchedulerOutput
from worker.engine.sequence import FinishReason, Sequence, SequenceStatus


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the tail is preempted first
        self.num_preemptions = 0
        # Prompt tokens run through the model, over all steps: recomputation after preemption
        # counts again, tokens found in the prefix cache do not.
        self.num_prompt_tokens_computed = 0
        # A request's other choices (params.n > 1), held until its first choice has computed
        # the prompt; keyed by that first choice.
        self._forks: dict[Sequence, list[Sequence]] = {}
        # What the last `schedule` planned, applied by `update` once the runner has run it.
        self._last_planned: list[tuple[Sequence, int]] = []

    # -- requests in and out -------------------------------------------------------------------

    def add(self, seq: Sequence, forks: Iterable[Sequence] = ()) -> None:
        """Queue a new sequence; it is considered at the next `schedule`.

        ``forks`` are the same request's other choices. With prefix caching, and a prompt of at
        least one full block, they wait until ``seq`` has computed the prompt and then start
        from its cached blocks: the prompt is computed once, not n times. Otherwise they queue
        now, behind ``seq``.
        """
        forks = list(forks)
        for s in (seq, *forks):
            s.status = SequenceStatus.WAITING
        self.waiting.append(seq)
        bm = self.block_manager
        if forks and bm.prefix_cache is not None and seq.num_prompt_tokens > bm.block_size:
            self._forks[seq] = forks
        else:
            self.waiting.extend(forks)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End ``seq`` (stop, length, stop string or abort) and return its blocks at once."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self._unqueue(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self._release_forks(seq)  # a first choice aborted alone hands its forks to the queue

    @property
    def num_unfinished(self) -> int:
        held = sum(len(forks) for forks in self._forks.values())
        return len(self.waiting) + len(self.running) + held

    def _unqueue(self, seq: Sequence) -> None:
        if seq in self.waiting:
            self.waiting.remove(seq)
            return
        for forks in self._forks.values():
            if seq in forks:
                forks.remove(seq)
                return

    def _release_forks(self, seq: Sequence) -> None:
        # To the front, in choice order: the request was admitted already, so its choices do
        # not queue again behind later arrivals.
        self.waiting.extendleft(reversed(self._forks.pop(seq, [])))

    # -- the step --------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        planned: dict[Sequence, int] = {}
        preempted: list[Sequence] = []
        # Decodes first: they cost one token each and set every user's time per output token.
        decodes = [s for s in self.running if s.num_uncomputed_tokens == 1]
        chunks = [s for s in self.running if s.num_uncomputed_tokens > 1]
        for seq in decodes + chunks:
            # Recomputed each time: a preemption below can hand back a victim's planned tokens.
            budget = self.config.max_num_batched_tokens - sum(planned.values())
            if seq.status is not SequenceStatus.RUNNING or budget == 0:
                continue
            num_new = min(seq.num_uncomputed_tokens, budget)
            if self._make_room(seq, num_new, planned, preempted):
                self.block_manager.allocate(seq, num_new)
                planned[seq] = num_new
        budget = self.config.max_num_batched_tokens - sum(planned.values())
        if not preempted:
            self._admit(planned, budget)
        return self._output(planned, preempted)

    def _make_room(
        self,
        seq: Sequence,
        num_new: int,
        planned: dict[Sequence, int],
        preempted: list[Sequence],
    ) -> bool:
        """Preempt from the tail of ``running`` until ``seq`` fits; False if ``seq`` itself went."""
        while not self.block_manager.can_allocate(seq, num_new):
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim)
            planned.pop(victim, None)  # undo its share of this step if it had one
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        # Front of the queue, keeping preempted sequences in their original order.
        self.waiting.appendleft(seq)

    def _admit(self, planned: dict[Sequence, int], budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            hit = self.block_manager.lookup(seq)  # its tokens need no computing
            num_new = min(seq.num_tokens - hit.num_tokens, budget)
            if not self.block_manager.can_allocate(seq, num_new, hit):
                break  # in order: a later, smaller request must not overtake the head
            self.waiting.popleft()
            self.block_manager.allocate(seq, num_new, hit)
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = hit.num_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            planned[seq] = num_new
            budget -= num_new

    def _output(self, planned: dict[Sequence, int], preempted: list[Sequence]) -> SchedulerOutput:
        self._last_planned = list(planned.items())
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
            for seq, n in planned.items()
        ]
        items.sort(key=lambda s: not s.is_decode)  # stable: decodes first, in running order
        return SchedulerOutput(
            scheduled=tuple(items),
            num_batched_tokens=sum(planned.values()),
            preempted_ids=tuple(s.request_id for s in preempted),
        )

    def update(self, output: SchedulerOutput) -> None:
        """After the runner ran ``output``: its scheduled tokens are now computed (and the blocks
        they filled are cached)."""
        for seq, num_new in self._last_planned:
            before = seq.num_computed_tokens
            seq.num_computed_tokens += num_new
            self.num_prompt_tokens_computed += max(
                0, min(seq.num_prompt_tokens, seq.num_computed_tokens) - before
            )
            self.block_manager.cache_full_blocks(seq, before)
            if seq.num_computed_tokens >= seq.num_prompt_tokens:
                self._release_forks(seq)
        self._last_planned = []
