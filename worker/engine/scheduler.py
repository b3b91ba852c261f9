"""Iteration-level scheduling: every step, who computes how many tokens.

Each step spends two budgets: ``max_num_seqs`` sequences and ``max_num_batched_tokens`` tokens.
Running decodes go first (one token each) so a long prompt never stalls them; then running
sequences still prefilling get chunks; then waiting sequences are admitted in the wait queue's
order: effective priority (lower is more urgent; it improves with age, ``aging``), then tenant
fair share, then arrival. When running decodes have a TPOT target, prefill gets only what the
step-cost model says the target leaves (``step_targets``, ``step_cost``). A step that can give an
interactive job its first token leaves less urgent running rows out (``first_token``).

Preemption frees a running sequence's blocks and requeues it under its original arrival, so it
keeps its place; it later recomputes and continues exactly where it stopped. The victim is the
least urgent (effective priority), most recently started sequence. Two things preempt: a running
sequence that needs a block when none is free (``kv_cache_full``), and a waiting sequence that
cannot start while less urgent ones run (``priority``, bounded by ``max_priority_preemptions``).
Admission of waiting sequences is ``admission.Admission``; planning the running ones, and
preempting, is here. The scheduler decides and never touches tensors.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from itertools import islice

from worker.engine.admission import Admission
from worker.engine.aging import Aging, Clock
from worker.engine.batch_cap import BATCH_FLOOR, BatchBound
from worker.engine.block_manager import BlockManager
from worker.engine.config import SchedulerConfig
from worker.engine.fair_share import FairShare
from worker.engine.first_token import FirstTokenLane, delivers, first_token_fits
from worker.engine.held_forks import HeldForks
from worker.engine.preemption import victim as pick_victim
from worker.engine.scheduler_output import ScheduledSequence, SchedulerOutput
from worker.engine.sequence import FinishReason, Sequence, SequenceStatus
from worker.engine.step_cost import StepCostModel, StepTimer
from worker.engine.step_plan import StepPlan
from worker.engine.step_targets import PrefillAllowance
from worker.engine.wait_queue import WaitQueue
from worker.engine.wait_reasons import Blocked, WaitInfo, explain

_tuple_new = tuple.__new__


class Scheduler:
    def __init__(
        self, config: SchedulerConfig, block_manager: BlockManager, clock: Clock = time.monotonic
    ) -> None:
        self.config = config
        self.block_manager = block_manager
        self.fair_share = FairShare(config.tenant_weights)
        self.aging = Aging(config.aging_per_s, clock)
        self.waiting = WaitQueue(self.fair_share, self.aging)
        self.step_cost = StepCostModel()
        self._timer = StepTimer(self.step_cost)
        self.last_allowance: PrefillAllowance | None = None  # of the last step, if it had one
        self.lane = FirstTokenLane(
            config.first_token_lane_steps, lambda s: block_manager.lookup(s).num_tokens
        )
        self.batch_bound = BatchBound(config.urgent_step_max or 0.0, config.max_num_batched_tokens)
        self.running: list[Sequence] = []  # in admission order
        self.num_preemptions = 0
        self.preemptions_by_reason: Counter[str] = Counter()
        self._blocked: Blocked | None = None  # where the last admission stopped
        # Prompt tokens run through the model, over all steps: recomputation after preemption
        # counts again, tokens found in the prefix cache do not.
        self.num_prompt_tokens_computed = 0
        self._forks = HeldForks()
        self.admission = Admission(
            config,
            block_manager,
            self.waiting,
            self.running,
            self.fair_share,
            self.aging,
            self._preempt,
        )

    # -- requests in and out -------------------------------------------------------------------

    def add(
        self, seq: Sequence, forks: Iterable[Sequence] = (), arrival_s: float | None = None
    ) -> None:
        """Queue a new sequence; it is considered at the next `schedule`. ``arrival_s``: when
        its request was submitted, on the scheduler's clock (None: now): it ages from then.

        ``forks`` are the same request's other choices. With prefix caching, and a prompt of at
        least one full block, they wait until ``seq`` has computed the prompt and then start
        from its cached blocks: the prompt is computed once, not n times. Otherwise they queue
        now, behind ``seq``.
        """
        forks = list(forks)
        for s in (seq, *forks):
            s.status = SequenceStatus.WAITING
            self.fair_share.activate(s.tenant)
            self.aging.arrive(s, arrival_s)
        self.waiting.add(seq)
        bm = self.block_manager
        if forks and bm.prefix_cache is not None and seq.num_prompt_tokens > bm.block_size:
            self._forks.hold(seq, forks)
        else:
            for fork in forks:
                self.waiting.add(fork)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End ``seq`` (stop, length, stop string or abort) and return its blocks at once."""
        if seq.status is SequenceStatus.FINISHED:
            return
        self.fair_share.deactivate(seq.tenant)
        self.aging.forget(seq)
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            if seq in self.waiting:
                self.waiting.remove(seq)
            else:
                self._forks.discard(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self._release_forks(seq)  # a first choice aborted alone hands its forks to the queue

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self._forks)

    def _release_forks(self, seq: Sequence) -> None:
        # They share the request's arrival index, so they queue ahead of later arrivals.
        for fork in self._forks.release(seq):
            self.waiting.add(fork)

    def wait_info(self) -> dict[str, WaitInfo]:
        """Why each waiting request (by request id) waits, as of the last ``schedule``."""
        held = self._forks.held()
        return explain(self.waiting, self._blocked, self.admission.capped_tenants(), held)

    # -- the step --------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        self.aging.tick()
        now = self.aging.now
        if (step_s := self._timer.begin(now, busy=bool(self.running))) is not None:
            self.batch_bound.observe(step_s)
        plan = StepPlan(self.config.max_num_batched_tokens)
        preempted: list[Sequence] = []
        head = self._lane_head()
        bound = self.batch_bound
        batch_waiting = self.waiting.has_priority_from(BATCH_FLOOR)
        bounding = bound.begin(self.running, head, batch_waiting, now)
        rows, held = self.lane.split(self.running, head, plan.token_budget)
        rows, bounded = bound.split(rows)  # batch rows: after the rest, under the bound
        # Decodes first: they cost one token each and set every user's time per output token.
        # One pass, the property inlined (two passes read it 512 times a 256-row step). A row
        # with nothing to compute (its last token in flight and ending it by length) is neither.
        decodes: list[Sequence] = []
        chunks: list[Sequence] = []
        for s in rows:
            n = len(s.token_ids) - s.num_computed_tokens
            if n == 1:
                decodes.append(s)
            elif n > 1:
                chunks.append(s)
        cfg = self.config
        self.last_allowance = allowance = PrefillAllowance.for_step(
            decodes,
            cfg.tpot_targets_s,
            self.step_cost,
            cfg.min_prefill_chunk_tokens,
            held,
            slowdown_max=cfg.tpot_slowdown_max,
        )
        oldest = chunks[0] if chunks else None  # admission order: the longest-running prefill
        if allowance is not None:  # the most urgent prefill first (the oldest keeps its floor)
            chunks.sort(key=self.aging.key)
        self._plan_decodes(decodes, plan, preempted)
        self._plan_running(chunks, plan, preempted, allowance, oldest)
        self._blocked = None
        if not preempted:
            self._blocked = self.admission.admit(
                plan, preempted, allowance, lane_only=bool(held), urgent_only=bounding
            )
        if held and not delivers(plan.tokens):  # no first token after all: the rows go too
            held, more = bound.split(held)
            bounded += more
            self._plan_running(held, plan, preempted, allowance, None)
            held = []
        self.lane.record(bool(held))
        if bounding:
            self._plan_bounded(bounded, plan, preempted, allowance, lane=bool(held))
        built = plan.built_decodes()
        rest = islice(plan.tokens.items(), len(built), None)
        output = SchedulerOutput.build(rest, preempted, built)
        self._timer.planned(output, self.aging.now)
        return output

    def _plan_bounded(
        self,
        bounded: list[Sequence],
        plan: StepPlan,
        preempted: list[Sequence],
        allowance: PrefillAllowance | None,
        lane: bool,
    ) -> None:
        """Batch work after the more urgent work, in what it leaves under the batch bound: the
        running batch rows, then batch prompts (none in a first-token lane step)."""
        bound = self.batch_bound
        if bound.open(plan.tokens):
            self._plan_running(bound.order(bounded), plan, preempted, allowance, None, bound)
            if not preempted and not lane and self._blocked is None:
                self._blocked = self.admission.admit(plan, preempted, allowance, False, bound=bound)
        bound.close(plan.tokens, bounded)

    def _lane_head(self) -> Sequence | None:
        """The waiting sequence admission would look at first; read only while the first-token
        lane may be taken (a head costs a pass over the running set's tenants)."""
        if not self.lane.open(self.waiting):
            return None
        return self.waiting.head(self.admission.capped_tenants())

    def _plan_decodes(
        self, decodes: list[Sequence], plan: StepPlan, preempted: list[Sequence]
    ) -> None:
        """`_plan_running` of running decodes not under the batch bound: what it does for a row
        of one token, in one loop of its own. Most steps are only this: at 256 rows the general
        loop's per-row tests cost ~0.05 ms a step."""
        bm, budget = self.block_manager, plan.token_budget
        block_size, tokens, built = bm.block_size, plan.tokens, plan.decodes
        running = SequenceStatus.RUNNING
        for seq in decodes:
            # Only `_make_room` lowers the plan's sum, for a row it plans, so at the budget
            # no later row fits either.
            if plan.num_tokens >= budget:
                return
            if seq.status is not running:  # preempted for an earlier row of this step
                continue
            # `bm.has_slots(seq, 1)` and `plan.add(seq, 1)` inlined: two calls a row fewer,
            # 0.10 -> 0.06 ms a 256-row step (`host_overhead.py --stub-device`).
            start, blocks = seq.num_computed_tokens, seq.block_ids
            held = len(blocks) * block_size
            if not held or start >= held:  # 1 step in 16 with 16-token blocks
                if not self._make_room(seq, 1, plan, preempted):
                    continue
                bm.allocate(seq, 1)
                blocks = seq.block_ids
            tokens[seq] = 1
            plan.num_tokens += 1
            # Its row, as `SchedulerOutput.build` would build it (a decode samples: its one
            # token is its last): built here, where the row's fields are at hand, a pass over
            # the rows fewer. The block table is final: a later preemption drops the row.
            ids = seq.token_ids
            built.append(
                _tuple_new(
                    ScheduledSequence,
                    (seq.request_id, (ids[start],), start, blocks, True, seq.seq_id),
                )
            )

    def _plan_running(
        self,
        seqs: list[Sequence],
        plan: StepPlan,
        preempted: list[Sequence],
        allowance: PrefillAllowance | None,
        oldest: Sequence | None,
        bound: BatchBound | None = None,
    ) -> None:
        """Plan running ``seqs`` in order; ``bound``: they are batch rows under the bound."""
        bm = self.block_manager
        for seq in seqs:
            # Read each time: a preemption below can hand back a victim's planned tokens.
            left = plan.tokens_left
            if seq.status is not SequenceStatus.RUNNING or left == 0:
                continue
            num_new = min(seq.num_uncomputed_tokens, left)
            if num_new > 1 and allowance is not None:  # the oldest prefill always progresses
                first_token = first_token_fits(seq, num_new)  # the rest of a chat's prompt
                num_new = allowance.grant(
                    seq, num_new, at_least_min=seq is oldest, first_token=first_token
                )
                if num_new == 0:
                    continue
            if bound is not None and (num_new := bound.grant(seq, num_new)) == 0:
                continue
            # Most decodes write into their last block: 15 of 16 steps with 16-token blocks.
            if not bm.has_slots(seq, num_new):
                if not self._make_room(seq, num_new, plan, preempted):
                    continue
                bm.allocate(seq, num_new)
            plan.add(seq, num_new)
            if num_new > 1 and allowance is not None:
                allowance.spend(seq, num_new)
            if bound is not None:
                bound.spend(seq, num_new)

    def _make_room(
        self, seq: Sequence, num_new: int, plan: StepPlan, preempted: list[Sequence]
    ) -> bool:
        """Preempt victims until ``seq`` fits; False if ``seq`` itself went."""
        while not self.block_manager.can_allocate(seq, num_new):
            victim = pick_victim(self.running, self.aging)
            self._preempt(victim, "kv_cache_full", plan, preempted)
            if victim is seq:
                return False
        return True

    def _preempt(
        self, seq: Sequence, reason: str, plan: StepPlan, preempted: list[Sequence]
    ) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        if reason == "priority":
            seq.num_priority_preemptions += 1
        self.num_preemptions += 1
        self.preemptions_by_reason[reason] += 1
        plan.drop(seq)  # undo its share of this step if it had one
        preempted.append(seq)
        self.waiting.add(seq)  # under its original arrival: it keeps its place

    def update(self, output: SchedulerOutput) -> None:
        """After the runner ran ``output``: its scheduled tokens are now computed (and the blocks
        they filled are cached). Works from ``output`` alone: a sequence that finished or was
        aborted since it was scheduled is skipped."""
        running = {s.seq_id: s for s in self.running}
        bm = self.block_manager
        # Only a step that fills a block has one to cache: 1 in 16 decode steps of a row.
        block_size = bm.block_size if bm.prefix_cache is not None else 0
        # Output tokens by tenant, charged once a step, not once a row: with the check above
        # (`cache_full_blocks` repeats it; here it saves the call for 15 of 16 rows), the update
        # of a 256-row decode step took 0.11 ms against 0.17-0.18 (`host_overhead.py
        # --stub-device`, Zen 4, BENCHMARKS.md).
        # Tenants appended, counted once after the loop: a Counter's `+= 1` a row cost more.
        sampled: list[str] = []
        forks = bool(self._forks)  # read once: only an admission holds forks back
        for _, token_ids, computed, _, samples, seq_id in output.scheduled:  # see `claim`
            seq = running.get(seq_id)
            if seq is None:
                continue
            before = seq.num_computed_tokens
            if before != computed:
                raise ValueError(f"stale step for sequence {seq_id}: applied twice?")
            seq.num_computed_tokens = after = before + len(token_ids)
            if before < seq.num_prompt_tokens:
                self.num_prompt_tokens_computed += min(seq.num_prompt_tokens, after) - before
            if block_size and after // block_size > before // block_size:
                bm.cache_full_blocks(seq, before)
            # As scheduled: in the overlapped loop the token's place is already held here
            # (`RequestState.reserve`), so the sequence is one longer than this step's end,
            # and a length test charged no output token but a sequence's last.
            if samples:
                sampled.append(seq.tenant)
            if forks and after >= seq.num_prompt_tokens:
                self._release_forks(seq)
        for tenant, num_tokens in Counter(sampled).items():
            self.fair_share.charge(tenant, output_tokens=num_tokens)
