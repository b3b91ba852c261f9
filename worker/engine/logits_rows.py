"""Per-sequence logits state: a constrained sequence's matcher, a penalized one's token counts.

``RowProcessors.apply`` runs in the sampler before it picks: it brings each row's state up to
the tokens its sequence holds (the one sampled last step, or a resumed run's tokens, replayed
once), fills the constrained rows' bitmask on the CPU and masks them all in one pass, then adds
the biases and penalties. A constrained row near the end of its budget may be closing
(``budget_closer``): its mask is then the one token its closing path takes next, or the stops.
State is kept per ``Sequence`` (weakly: it goes with its sequence), so a preempted sequence
keeps its matcher while it recomputes, and each of ``n`` choices has its own. The grammar mask
stays in the logits (logprobs of a constrained row are over what the constraint allows, as in
vLLM); biases and penalties are undone after sampling.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog
import torch

from worker.engine.budget_closer import STOPS, BudgetCloser
from worker.engine.grammar import GrammarError, Matcher
from worker.engine.grammar_compiles import GrammarCompiles
from worker.engine.penalties import TokenCounts, Undo, apply_bias, apply_penalties, undo
from worker.engine.sequence import Sequence as Seq

if TYPE_CHECKING:  # the sampler imports this module
    from worker.engine.sampler import SamplingRequest

log = structlog.get_logger("paternoster.engine")
# Sampling rows: (row index in the batch, its sequence, its params' output index snapshot).
Row = tuple[int, Seq, int]


class RowState:
    """What one sequence's logits need beyond its params, advanced token by token."""

    def __init__(
        self, seq: Seq, matcher: Matcher | None, stops: Collection[int], max_model_len: int
    ) -> None:
        params = seq.params
        self.matcher = matcher
        self.stops = stops  # a constrained row ends only where its grammar may
        self.stop_key = tuple(sorted(stops))
        # Budget-aware closing (``budget_closer``), for rows a stop token ends (not ignore_eos:
        # those run to max_tokens whatever they sample). ``end_len``: where ``length`` cuts it.
        self.closer = BudgetCloser() if matcher is not None and not params.ignore_eos else None
        self.end_len = min(seq.num_prompt_tokens + params.max_tokens, max_model_len)
        self.counts: TokenCounts | None = None
        if params.penalized:
            with_prompt = params.repetition_penalty != 1.0
            self.counts = TokenCounts(seq.token_ids[: seq.num_prompt_tokens] if with_prompt else ())
        self.num_seen = seq.num_prompt_tokens  # tokens of the sequence taken in so far

    def catch_up(self, seq: Seq, num_tokens: int) -> None:
        """Take in the sequence's tokens up to ``num_tokens``; ``GrammarError`` for one its
        grammar does not allow (a resumed run's token under another constraint)."""
        for position in range(self.num_seen, num_tokens):
            token = seq.token_ids[position]
            if self.counts is not None:
                self.counts.add(token)
            if self.closer is not None and self.allowed(position) is not None:
                self.closer.taken(token)  # a replayed position: decided as the first run did
            if self.matcher is not None and not self._accept(token):
                index = position - seq.num_prompt_tokens
                raise GrammarError(f"output token {index} ({token}) breaks the structure")
        self.num_seen = max(self.num_seen, num_tokens)

    def allowed(self, position: int) -> int | None:
        """The closer's decision at sequence ``position`` (``BudgetCloser.decide``). A failure
        in it ends closing for this row, which then samples as without it."""
        if self.closer is None or self.matcher is None or self.matcher.is_terminated():
            return None
        try:
            return self.closer.decide(self.matcher, position, self.end_len - position)
        except Exception as exc:  # a backend's search bug must not end the step
            log.warning("budget_closing_failed", error=repr(exc)[:300], position=position)
            self.closer = None
            return None

    def _accept(self, token: int) -> bool:
        assert self.matcher is not None
        if self.matcher.is_terminated():  # more stop tokens (min_tokens or ignore_eos)
            return token in self.stops
        return self.matcher.accept(token)


@dataclass
class RowChanges:
    """What ``apply`` did: rows whose grammar allows only a stop token, and what to undo."""

    forced_stop: set[int] = field(default_factory=set)
    undo: Undo = field(default_factory=list)


class RowProcessors:
    """The state of every constrained or penalized sequence the sampler has seen."""

    def __init__(
        self,
        eos_token_ids: Sequence[int],
        grammars: GrammarCompiles | None,
        max_model_len: int | None = None,
    ) -> None:
        self.eos_token_ids = tuple(eos_token_ids)
        self.grammars = grammars
        self.max_model_len = max_model_len if max_model_len is not None else 1 << 62
        self._states: weakref.WeakKeyDictionary[Seq, RowState] = weakref.WeakKeyDictionary()
        self._bitmask: torch.Tensor | None = None
        self._stop_rows: dict[tuple[int, ...], torch.Tensor] = {}

    def process(
        self, logits: torch.Tensor, requests: Sequence[SamplingRequest]
    ) -> RowChanges | None:
        """``apply`` to the rows with a constraint, a penalty or a bias; None if none has."""
        rows: list[Row] = []
        for i, r in enumerate(requests):
            if r.params.structure is not None or r.params.penalized:
                if r.seq is None:
                    raise ValueError("a constrained or penalized row needs its sequence")
                rows.append((i, r.seq, r.output_index))
        return self.apply(logits, rows) if rows else None

    def apply(self, logits: torch.Tensor, rows: Sequence[Row]) -> RowChanges:
        """Mask, bias and penalize ``logits`` in place for ``rows``; see the module's doc. On
        an error nothing is left to undo (the sampler may retry the rows one by one)."""
        changes = RowChanges()
        states = [self._state(seq, num_out) for _, seq, num_out in rows]
        constrained = [(row, s) for row, s in zip(rows, states, strict=True) if s.matcher]
        if constrained:
            changes.forced_stop = self._mask(logits, constrained)
        counted = [(i, seq.params, s.counts) for (i, seq, _), s in zip(rows, states, strict=True)]
        try:
            indices, params = [i for i, _, _ in counted], [p for _, p, _ in counted]
            changes.undo += apply_bias(logits, indices, params)
            penalized = [(i, p, c) for i, p, c in counted if c is not None]
            if penalized:
                rows_p, params_p, counts_p = zip(*penalized, strict=True)
                changes.undo += apply_penalties(logits, rows_p, params_p, counts_p)
        except Exception:
            undo(logits, changes.undo)
            raise
        return changes

    def _state(self, seq: Seq, num_output: int) -> RowState:
        state = self._states.get(seq)
        if state is None:
            stops = {*self.eos_token_ids, *seq.params.stop_token_ids}
            structure = seq.params.structure
            matcher = None
            if structure is not None:
                if self.grammars is None:
                    raise GrammarError("invalid sampling parameter structure: no grammar backend")
                matcher = self.grammars.compiled(structure).matcher(sorted(stops))
            state = RowState(seq, matcher, stops, self.max_model_len)
            self._states[seq] = state
        state.catch_up(seq, seq.num_prompt_tokens + num_output)
        return state

    def _mask(self, logits: torch.Tensor, constrained: list[tuple[Row, RowState]]) -> set[int]:
        """Fill and apply the constrained rows' bitmask; the rows it leaves only stops."""
        assert self.grammars is not None
        backend = self.grammars.backend()
        bitmask = self._bitmask_for(logits.shape[0], backend.allocate_bitmask)
        forced: set[int] = set()
        for (row, seq, num_out), state in constrained:
            assert state.matcher is not None
            stop_row = self._stop_row(state.stop_key, bitmask.shape[1])
            allowed = state.allowed(seq.num_prompt_tokens + num_out)
            if state.matcher.is_terminated() or allowed == STOPS:
                bitmask[row] = stop_row
            elif allowed is not None:  # closing: the next token of the path only
                bitmask[row] = 0
                bitmask[row, allowed // 32] = _as_int32(1 << (allowed % 32))
            else:
                state.matcher.fill(bitmask, row)
            if num_out < seq.params.min_tokens and not (bitmask[row] & ~stop_row).any():
                forced.add(row)  # min_tokens cannot hold: the grammar ends here
        backend.apply_bitmask(logits, bitmask, [row for (row, _, _), _ in constrained])
        return forced

    def _bitmask_for(self, rows: int, allocate: Callable[[int], torch.Tensor]) -> torch.Tensor:
        """The bitmask buffer, reused across steps (every row used is filled first)."""
        if self._bitmask is None or self._bitmask.shape[0] < rows:
            self._bitmask = allocate(max(rows, 64))
        return self._bitmask

    def _stop_row(self, stops: tuple[int, ...], width: int) -> torch.Tensor:
        """The bitmask row that allows only ``stops``."""
        row = self._stop_rows.get(stops)
        if row is None:
            words = [0] * width
            for t in stops:
                words[t // 32] |= 1 << (t % 32)
            signed = [_as_int32(w) for w in words]
            row = self._stop_rows[stops] = torch.tensor(signed, dtype=torch.int32)
        return row


def _as_int32(word: int) -> int:
    """A 32-bit mask word as the signed int32 the bitmask holds."""
    return word - (1 << 32) if word >= 1 << 31 else word
