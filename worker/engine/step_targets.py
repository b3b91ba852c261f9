"""Per-band TPOT targets: how much prefill one step may carry so running decodes stay on time.

Every running decode waits for the whole step, so a step that carries a 512-token chunk of a
long prompt (~0.4 s on a 2-core CPU) sets every running chat's time per output token. Each step
the scheduler finds the most demanding target among the bands of its running decodes and gives
prefill only the seconds the step cost model (``step_cost``) says are left under it. With no
decode of a band that has a target, a step keeps the whole token budget (offline throughput is
unchanged). Where steps are fast, a fixed target leaves room for several times a decode step's
work (150 ms against 35 ms decode-only steps of SmolLM2 on a quiet 2-core CPU: chats at 4x
their TPOT alone during a burst), so a step is also held to ``slowdown_max`` times what its
decodes alone are predicted to cost; the fixed target caps it where steps are slow. Under that
bound prefill always has 0.4/1.4 of the step at the default, its progress guarantee; the
token floors below then apply only where not one token fits. Whatever the target, the oldest
running prefill gets at least ``min_chunk_tokens``
a step, so a long prompt always makes progress (a stream of chats cannot starve it), and so
does the step's first admission when nothing else prefills or when it is of a band as demanding
as the step's (a long prompt cannot hold back every new chat): ``admission_floor``.

A first-token lane step (``first_token``) leaves less urgent decodes out, but carries them after
all when it delivers no first token. So the allowance is sized as if they ran (their bands'
targets and their cost count), and their cost is a credit only a grant that delivers a lane
sequence's first token may spend (``first_token=True``): if one does, they stay out and the
credit is what they would have cost; if none does, the credit is unspent and the step, with
them, is still under its target.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from operator import attrgetter

from producer.keys import BANDS, band_of
from worker.engine.sequence import Sequence
from worker.engine.step_cost import StepCost, StepCostModel, StepFeatures

_PRIORITY, _TOKEN_IDS = attrgetter("priority"), attrgetter("token_ids")


class PrefillAllowance:
    """The seconds of prefill one step has left under its decodes' target."""

    def __init__(self, cost: StepCost, left_s: float, min_chunk_tokens: int) -> None:
        self.cost = cost
        self.left_s = left_s
        self.min_chunk_tokens = min_chunk_tokens
        self.num_tokens = 0  # prefill tokens granted in this step
        self.lane_credit_s = 0.0  # the left-out decodes' cost: room for a first token only
        self.target_s = 0.0  # the target this step is sized to (set by ``for_step``)
        self.band_target_s = 0.0  # its decodes' most demanding band's target, before slowdown
        self.targets_s: Mapping[str, float] = {}  # every band's

    @classmethod
    def for_step(
        cls,
        decodes: Seq[Sequence],
        targets_s: Mapping[str, float],
        model: StepCostModel,
        min_chunk_tokens: int,
        left_out: Seq[Sequence] = (),
        slowdown_max: float = 0.0,
    ) -> PrefillAllowance | None:
        """The allowance of a step whose decodes are ``decodes``, and ``left_out`` those a
        first-token lane step leaves out unless it delivers no first token; None when none
        of them is of a band with a target (the step keeps its whole token budget, and
        ``model`` is not refitted). ``slowdown_max`` > 0 also holds the step to that many
        times the decodes' own predicted cost."""
        if not targets_s:
            return None
        by_priority: dict[int, float] = {}  # a few priorities among up to 256 decodes
        kept = _decodes(decodes, targets_s, by_priority)
        out = _decodes(left_out, targets_s, by_priority)
        target_s = min(by_priority.values(), default=math.inf)
        if target_s == math.inf:
            return None
        cost = model.cost
        decode_s = cost.predict_s(StepFeatures(kept[0] + out[0], 0, kept[1] + out[1]))
        band_target_s = target_s
        if slowdown_max > 0:
            target_s = min(target_s, slowdown_max * decode_s)
        allowance = cls(cost, target_s - decode_s, min_chunk_tokens)
        allowance.target_s, allowance.band_target_s = target_s, band_target_s
        allowance.targets_s = targets_s
        if out[0]:
            kept_s = cost.predict_s(StepFeatures(kept[0], 0, kept[1]))
            allowance.lane_credit_s = decode_s - kept_s
        return allowance

    @property
    def slowed(self) -> bool:
        """The slowdown bound, not the band's target, sizes this step."""
        return self.target_s < self.band_target_s

    def _as_demanding(self, seq: Sequence) -> bool:
        """``seq``'s band has a target as tight as the step's band target (a chat's prompt)."""
        return self.targets_s.get(band_of(seq.priority), math.inf) <= self.band_target_s

    def admission_floor(self, seq: Sequence) -> bool:
        """Whether the step's first admission, ``seq``, gets ``min_chunk_tokens`` whatever
        fits: when no other prefill runs this step (so a prompt always starts), or when its
        band's target is as tight as the step's (a chat is not held back by long prompts; a
        burst of long ones is not started all at once, one floor each)."""
        return self.num_tokens == 0 or self._as_demanding(seq)

    def grant(
        self,
        seq: Sequence,
        wanted: int,
        *,
        at_least_min: bool = False,
        first_token: bool = False,
    ) -> int:
        """Tokens of ``seq``'s next ``wanted`` that fit; ``at_least_min``: at least
        ``min_chunk_tokens`` (or ``wanted``) whatever fits; ``first_token``: ``wanted`` is
        the rest of a lane sequence's prompt, granted whole with ``lane_credit_s`` if it
        fits so. 0: none fit this step."""
        if first_token and self.lane_credit_s > 0:
            if self._fits(seq, wanted, self.left_s + self.lane_credit_s) == wanted:
                return wanted
        fits = self._fits(seq, wanted, self.left_s + self._urgent_room_s(seq))
        # Under the slowdown bound the room is 0.4 of a decode step or more, so a floor is owed
        # only where not one token fits: on 1 thread, 16 floor tokens (2.3 ms each) beside 8
        # chats' 35 ms put them at 2.05x alone where the bound alone allows 1.5x.
        if at_least_min and (fits == 0 or not self.slowed):
            fits = max(fits, self.min_chunk_tokens)
        return min(wanted, fits)

    def _urgent_room_s(self, seq: Sequence) -> float:
        """The room between the slowdown bound and the band's own target, which the prompt of
        a band as demanding as the step's may also use: held to the bound, a 64-token chat
        prompt took several steps to its first token, and chat TTFT p99 on the serving path
        rose from 2.41 to 2.74 s (load.py, 0.4 jobs/s); one step over the bound costs the
        running chats far less."""
        if not self.slowed or not self._as_demanding(seq):
            return 0.0
        return self.band_target_s - self.target_s

    def _fits(self, seq: Sequence, wanted: int, left_s: float) -> int:
        """Tokens of ``seq``'s next ``wanted`` whose cost fits in ``left_s``."""
        # A chunk of n tokens after s computed ones costs n * per_prefill + (s + n) * per_context.
        c = self.cost
        per_token_s = c.per_prefill_token_s + c.per_context_token_s
        room = left_s - c.per_context_token_s * seq.num_computed_tokens
        if per_token_s <= 0:
            return wanted
        # The epsilon keeps 0.036 / 0.001 from flooring to 35 on its last bit.
        return min(wanted, max(0, int(room / per_token_s + 1e-9)) if room > 0 else 0)

    def spend(self, seq: Sequence, num_tokens: int) -> None:
        """``seq`` was planned ``num_tokens`` of prefill (its computed tokens not yet moved)."""
        c = self.cost
        self.left_s -= c.per_prefill_token_s * num_tokens + c.per_context_token_s * (
            seq.num_computed_tokens + num_tokens
        )
        self.num_tokens += num_tokens


def _decodes(
    decodes: Seq[Sequence], targets_s: Mapping[str, float], by_priority: dict[int, float]
) -> tuple[int, int]:
    """The number of ``decodes`` and the context they attend over; their priorities' targets
    go into ``by_priority``."""
    # C-level passes (a few priorities among up to 256 rows): 0.023 -> 0.017 ms a call at
    # 256 rows against a Python loop (thread CPU time, Zen 4; BENCHMARKS.md "thirteenth pass").
    for priority in set(map(_PRIORITY, decodes)):
        if priority not in by_priority:
            by_priority[priority] = targets_s.get(band_of(priority), math.inf)
    return len(decodes), sum(map(len, map(_TOKEN_IDS, decodes)))


def format_tpot_targets(targets_ms: Mapping[str, float]) -> str:
    """``parse_tpot_targets``' inverse: ``interactive=150,default=400``, or ``off``."""
    return ",".join(f"{band}={ms:g}" for band, ms in targets_ms.items()) or "off"


def parse_tpot_targets(text: str) -> dict[str, float]:
    """``--tpot-target-ms`` (``interactive=150,default=400``; ``off``: none) as milliseconds
    by band."""
    if text.strip().lower() in ("", "off", "none"):
        return {}
    targets = {}
    for item in text.split(","):
        band, sep, value = item.strip().partition("=")
        if not sep or band not in BANDS:
            raise ValueError(f"--tpot-target-ms takes BAND=MS with BAND in {BANDS}, got {item!r}")
        targets[band] = float(value)
    return targets
