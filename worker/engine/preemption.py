"""Who loses its blocks: the victim rule, and the victims an urgent sequence may take.

A pure decision over the running set; the scheduler applies it. Preempting frees a sequence's
blocks and requeues it; it recomputes later and goes on from where it stopped.
"""

from __future__ import annotations

from collections.abc import Iterable

from worker.engine.block_manager import BlockManager
from worker.engine.config import SchedulerConfig
from worker.engine.prefix_cache import PrefixHit
from worker.engine.sequence import Sequence


def victim(candidates: Iterable[Sequence]) -> Sequence:
    """The least urgent, then most recently started, sequence."""
    return max(candidates, key=lambda s: (s.priority, s.start_index))


def victims_for(
    seq: Sequence,
    num_new: int,
    hit: PrefixHit,
    running: list[Sequence],
    config: SchedulerConfig,
    block_manager: BlockManager,
) -> list[Sequence]:
    """Running sequences to preempt, in order, so waiting ``seq`` can start: only strictly less
    urgent ones (two sequences can never preempt each other), and none already preempted
    ``max_priority_preemptions`` times for priority. Empty if ``seq`` may not preempt, or if
    even all eligible victims would not make room (then preempting any would only waste work).
    """
    if not config.preempt_for_priority:
        return []
    limit = config.max_priority_preemptions
    eligible = [
        r for r in running if r.priority > seq.priority and r.num_priority_preemptions < limit
    ]
    need_slot = len(running) >= config.max_num_seqs
    short = block_manager.num_needed(seq, num_new, hit) - block_manager.num_free_blocks
    chosen: list[Sequence] = []
    while eligible and (
        (need_slot and not chosen) or short > block_manager.num_reclaimable(chosen)
    ):
        chosen.append(victim(eligible))
        eligible.remove(chosen[-1])
    if (need_slot and not chosen) or short > block_manager.num_reclaimable(chosen):
        return []
    return chosen
