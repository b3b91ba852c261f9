"""Why a waiting request is waiting: one reason and a position, kept current every step.

Users of every engine we compete with ask "why is my request not running?" and get no answer.
The scheduler records where admission stopped (the blocked sequence and why); each waiting
request's reason follows from where it stands relative to that point.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from worker.engine.sequence import Sequence


class WaitReason(enum.StrEnum):
    BEHIND_HIGHER_PRIORITY = "behind_higher_priority"  # a more urgent request waits too
    # A request of a less urgent priority that has waited long enough to go first (aging).
    BEHIND_OLDER_REQUEST = "behind_older_request"
    NO_BATCH_SLOT = "no_batch_slot"  # the running batch holds max_num_seqs sequences
    KV_CACHE_FULL = "kv_cache_full"  # not enough free KV blocks for its next chunk
    TENANT_CAP = "tenant_cap"  # its tenant runs max_running_per_tenant sequences already
    STEP_BUDGET = "step_budget"  # this step's token budget went to others; next step
    # This step's prefill was cut so running decodes meet their band's TPOT target; next step.
    TPOT_TARGET = "tpot_target"
    # A batch job: batch work fills steps only up to a bound while more urgent jobs are about.
    URGENT_WORK = "urgent_work"
    SHARED_PROMPT = "shared_prompt"  # an n > 1 choice waiting for choice 0 to compute the prompt
    COMPILING_GRAMMAR = "compiling_grammar"  # its structure constraint compiles off the loop


@dataclass(frozen=True)
class Blocked:
    """Where the last admission stopped: the sequence that could not start, and why."""

    seq: Sequence
    reason: WaitReason


@dataclass(frozen=True)
class WaitInfo:
    reason: WaitReason
    position: int  # waiting sequences ahead of this request's first waiting choice
    preempted: bool  # it ran before and lost its blocks (it resumes where it stopped)


def explain(
    ordered: Iterable[Sequence],
    blocked: Blocked | None,
    capped_tenants: set[str],
    held: Iterable[Sequence],
) -> dict[str, WaitInfo]:
    """Each waiting request's reason, by request id; ``ordered`` is the queue in admission
    order, ``held`` the choices that wait for their request's prompt."""
    infos: dict[str, WaitInfo] = {}
    for position, seq in enumerate(ordered):
        if seq.request_id not in infos:
            reason = _reason(seq, blocked, capped_tenants)
            infos[seq.request_id] = WaitInfo(reason, position, seq.num_preemptions > 0)
    for seq in held:
        if seq.request_id not in infos:
            infos[seq.request_id] = WaitInfo(WaitReason.SHARED_PROMPT, 0, False)
    return infos


def _reason(seq: Sequence, blocked: Blocked | None, capped_tenants: set[str]) -> WaitReason:
    if seq.tenant in capped_tenants:
        return WaitReason.TENANT_CAP
    if blocked is None:
        return WaitReason.STEP_BUDGET
    if blocked.seq.priority < seq.priority:
        return WaitReason.BEHIND_HIGHER_PRIORITY
    if blocked.seq.priority > seq.priority:  # it is ahead only by its age
        return WaitReason.BEHIND_OLDER_REQUEST
    return blocked.reason
