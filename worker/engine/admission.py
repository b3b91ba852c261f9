"""Admission: which waiting sequences start this step, and how many of their tokens it computes.

The scheduler plans its running sequences first and hands the rest of the step to ``admit``:
waiting sequences start in the wait queue's order (effective priority, tenant fair share,
arrival) while the step has tokens, a batch slot and blocks for them. A sequence starts after
the longest prefix the block manager has cached for it. One that cannot start stops admission
(a later, smaller one must not overtake it), unless it outranks running sequences it may
preempt (``preemption.victims_for``); then those go and it is looked at again. Where admission
stopped, and why, is what ``wait_info`` reports (``Blocked``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from worker.engine.aging import Aging
from worker.engine.batch_cap import BatchBound, is_batch
from worker.engine.block_manager import BlockManager
from worker.engine.config import SchedulerConfig
from worker.engine.fair_share import FairShare, capped_tenants
from worker.engine.first_token import first_token_fits, in_lane
from worker.engine.preemption import victims_for
from worker.engine.prefix_cache import PrefixHit
from worker.engine.sequence import Sequence, SequenceStatus
from worker.engine.step_plan import StepPlan
from worker.engine.step_targets import PrefillAllowance
from worker.engine.wait_queue import WaitQueue
from worker.engine.wait_reasons import Blocked, WaitReason

# Preempt one running sequence for a reason ("priority"), undoing its share of the step plan
# and recording it among the step's preempted sequences (``Scheduler._preempt``).
Preempt = Callable[[Sequence, str, StepPlan, list[Sequence]], None]


class Admission:
    """Starts waiting sequences into the scheduler's running list (shared, appended to here)."""

    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        waiting: WaitQueue,
        running: list[Sequence],
        fair_share: FairShare,
        aging: Aging,
        preempt: Preempt,
    ) -> None:
        self.config = config
        self.block_manager = block_manager
        self.waiting = waiting
        self.running = running
        self.fair_share = fair_share
        self.aging = aging
        self._preempt = preempt
        self._starts = itertools.count()  # start order: the victim rule takes the newest

    def capped_tenants(self) -> set[str]:
        """Tenants at their running cap (``max_running_per_tenant``): none of theirs starts."""
        return capped_tenants(self.running, self.config.max_running_per_tenant)

    def admit(
        self,
        plan: StepPlan,
        preempted: list[Sequence],
        allowance: PrefillAllowance | None,
        lane_only: bool,  # a first-token lane step: only the lane's band starts
        urgent_only: bool = False,  # batch work is bounded: no batch prompt starts yet
        bound: BatchBound | None = None,  # batch prompts start under it (batch_cap.py)
    ) -> Blocked | None:
        """Start waiting sequences into ``plan`` until its tokens, the batch or the blocks run
        out; where admission stopped (None: the queue is empty, or the step's kind starts no
        more)."""
        capped = self.capped_tenants()
        first = True  # the step's first admission may get a minimum chunk
        while (budget := plan.tokens_left) > 0:
            seq = self.waiting.head(capped)
            # Never restart a victim in the step it lost; a lane step starts only the lane's band.
            if seq is None or seq in preempted or (lane_only and not in_lane(seq)):
                return None
            if urgent_only and is_batch(seq):
                return None
            hit = self.block_manager.lookup(seq)  # its tokens need no computing
            num_new = min(seq.num_tokens - hit.num_tokens, budget)
            if allowance is not None:
                floor = first and allowance.admission_floor(seq)
                first_token = first_token_fits(seq, num_new, hit.num_tokens)
                num_new = allowance.grant(seq, num_new, at_least_min=floor, first_token=first_token)
                if num_new == 0:
                    return Blocked(seq, WaitReason.TPOT_TARGET)
            if bound is not None and is_batch(seq):
                if (num_new := bound.grant(seq, num_new)) == 0:
                    return Blocked(seq, WaitReason.URGENT_WORK)
            blocker = self._blocker(seq, num_new, hit)
            if blocker is not None:
                victims = victims_for(
                    seq, num_new, hit, self.running, self.config, self.block_manager, self.aging
                )
                if not victims:
                    # In order: a later, smaller request must not overtake the head.
                    return Blocked(seq, blocker)
                for v in victims:
                    self._preempt(v, "priority", plan, preempted)
                continue  # budget and prefix hit may have changed: look again
            self._start(seq, num_new, hit, plan)
            if allowance is not None:
                allowance.spend(seq, num_new)
            if bound is not None and is_batch(seq):
                bound.spend(seq, num_new)
            first = False
            capped = self.capped_tenants()
        head = self.waiting.head(capped)
        return None if head is None else Blocked(head, WaitReason.STEP_BUDGET)

    def _start(self, seq: Sequence, num_new: int, hit: PrefixHit, plan: StepPlan) -> None:
        self.waiting.remove(seq)
        self.block_manager.allocate(seq, num_new, hit)
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = hit.num_tokens
        # Charged once per prompt token, at admission, so that admitting several sequences in
        # one step already alternates tenants; a recomputation after preemption is not charged.
        uncharged = seq.num_prompt_tokens - max(hit.num_tokens, seq.num_prompt_tokens_charged)
        if uncharged > 0:
            self.fair_share.charge(seq.tenant, prompt_tokens=uncharged)
            seq.num_prompt_tokens_charged = seq.num_prompt_tokens
        seq.status = SequenceStatus.RUNNING
        seq.start_index = next(self._starts)
        self.running.append(seq)
        plan.add(seq, num_new)

    def _blocker(self, seq: Sequence, num_new: int, hit: PrefixHit) -> WaitReason | None:
        if len(self.running) >= self.config.max_num_seqs:
            return WaitReason.NO_BATCH_SLOT
        if not self.block_manager.can_allocate(seq, num_new, hit):
            return WaitReason.KV_CACHE_FULL
        return None
