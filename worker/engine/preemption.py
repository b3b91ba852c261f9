"""Who loses its blocks: the victim rule, and the victims an urgent sequence may take.

A pure decision over the running set; the scheduler applies it. Preempting frees a sequence's
blocks and requeues it; it recomputes later and goes on from where it stopped.
"""

from __future__ import annotations

from collections.abc import Iterable

from worker.engine.aging import Aging
from worker.engine.block_manager import BlockManager
from worker.engine.config import SchedulerConfig
from worker.engine.prefix_cache import PrefixHit
from worker.engine.sequence import Sequence


def victim(candidates: Iterable[Sequence], aging: Aging) -> Sequence:
    """Of the priority of the least urgent sequence by effective priority (``Aging.key``), the
    most recently started sequence (with aging off: the least urgent, then newest)."""
    candidates = list(candidates)
    level = max(candidates, key=aging.key).priority
    return max((s for s in candidates if s.priority == level), key=lambda s: s.start_index)


def victims_for(
    seq: Sequence,
    num_new: int,
    hit: PrefixHit,
    running: list[Sequence],
    config: SchedulerConfig,
    block_manager: BlockManager,
    aging: Aging,
) -> list[Sequence]:
    """Running sequences to preempt, in order, so waiting ``seq`` can start: only ones it
    outranks (``Aging.outranks``: another priority, strictly less urgent by the effective
    priority the queue uses; so two sequences never preempt each other), and none preempted
    ``max_priority_preemptions`` times for priority already. Empty if ``seq`` may not preempt, or if
    even all eligible victims would not make room (then preempting any would only waste work).
    """
    if not config.preempt_for_priority:
        return []
    limit = config.max_priority_preemptions
    eligible = [r for r in running if aging.outranks(seq, r) and r.num_priority_preemptions < limit]
    need_slot = len(running) >= config.max_num_seqs
    short = block_manager.num_needed(seq, num_new, hit) - block_manager.num_free_blocks
    chosen: list[Sequence] = []
    while eligible and (
        (need_slot and not chosen) or short > block_manager.num_reclaimable(chosen)
    ):
        chosen.append(victim(eligible, aging))
        eligible.remove(chosen[-1])
    if (need_slot and not chosen) or short > block_manager.num_reclaimable(chosen):
        return []
    return chosen
