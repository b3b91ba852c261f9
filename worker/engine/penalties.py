"""Presence, frequency and repetition penalties and the logit bias, batched over rows.

vLLM's semantics: the bias is added first; then the repetition penalty divides the positive
logits (multiplies the others) of every token in the prompt or the output; then the frequency
penalty subtracts ``f x count`` and the presence penalty ``p`` for each token the output holds.
Only the logits of tokens a row has seen or biases are touched: each row keeps its distinct
tokens and their output counts in ``TokenCounts``, grown by one token a step (never recounted
from the whole history), and one step gathers, changes and scatters them for all rows at once.
Every change is undone after sampling (``Undo``): logprobs, like vLLM's, come from raw logits.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from worker.engine.sampling_params import SamplingParams

# Undo: what the applied changes overwrote, (row indices, token ids) and the values, in order.
Undo = list[tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]]


class TokenCounts:
    """One sequence's distinct tokens and how often its output holds each. With ``prompt``
    (for a repetition penalty) the prompt's tokens are in it too, with count 0."""

    def __init__(self, prompt: Sequence[int] = ()) -> None:
        unique = np.unique(np.asarray(prompt, dtype=np.int64))
        size = max(16, 2 * len(unique))
        self._ids = np.zeros(size, dtype=np.int64)
        self._counts = np.zeros(size, dtype=np.float32)
        self._ids[: len(unique)] = unique
        self._where = {int(t): i for i, t in enumerate(unique)}
        self.size = len(unique)

    def add(self, token_id: int) -> None:
        """Count one more output token."""
        i = self._where.get(token_id)
        if i is None:
            i = self.size
            if i == len(self._ids):  # doubling: amortised O(1) a token
                self._ids = np.concatenate([self._ids, np.zeros_like(self._ids)])
                self._counts = np.concatenate([self._counts, np.zeros_like(self._counts)])
            self._ids[i] = token_id
            self._where[token_id] = i
            self.size += 1
        self._counts[i] += 1.0

    def ids(self) -> np.ndarray:
        return self._ids[: self.size]

    def counts(self) -> np.ndarray:
        return self._counts[: self.size]


def apply_bias(logits: torch.Tensor, rows: Sequence[int], params: Sequence[SamplingParams]) -> Undo:
    """Add each row's ``logit_bias``, in place; what it overwrote, to put back."""
    pairs = [(r, p.logit_bias) for r, p in zip(rows, params, strict=True) if p.logit_bias]
    if not pairs:
        return []
    row_ids = np.concatenate([np.full(len(b), r, dtype=np.int64) for r, b in pairs])
    token_ids = np.concatenate([np.fromiter(b.keys(), np.int64, len(b)) for _, b in pairs])
    bias = np.concatenate([np.fromiter(b.values(), np.float32, len(b)) for _, b in pairs])
    index = _index(logits, row_ids, token_ids)
    held = logits[index]
    logits[index] = held + torch.from_numpy(bias).to(logits.device)
    return [(index, held)]


def apply_penalties(
    logits: torch.Tensor,
    rows: Sequence[int],
    params: Sequence[SamplingParams],
    counts: Sequence[TokenCounts],
) -> Undo:
    """Apply each row's repetition, frequency and presence penalties, in place, to the tokens
    its ``counts`` holds; what they overwrote, to put back."""
    parts = [
        (r, p, c)
        for r, p, c in zip(rows, params, counts, strict=True)
        if c.size and (p.repetition_penalty != 1.0 or p.frequency_penalty or p.presence_penalty)
    ]
    if not parts:
        return []
    sizes = [c.size for _, _, c in parts]
    row_ids = np.repeat(np.array([r for r, _, _ in parts], dtype=np.int64), sizes)
    token_ids = np.concatenate([c.ids() for _, _, c in parts])
    index = _index(logits, row_ids, token_ids)
    dev = logits.device
    per_token = np.repeat(
        np.array(
            [(p.repetition_penalty, p.frequency_penalty, p.presence_penalty) for _, p, _ in parts],
            dtype=np.float32,
        ),
        sizes,
        axis=0,
    )
    rep, freq, presence = torch.from_numpy(per_token).to(dev).unbind(1)  # (T,) each
    count = torch.from_numpy(np.concatenate([c.counts() for _, _, c in parts])).to(dev)
    held = logits[index]  # (T,)
    value = torch.where(held > 0, held / rep, held * rep)
    value -= freq * count + presence * (count > 0)
    logits[index] = value
    return [(index, held)]


def undo(logits: torch.Tensor, changes: Undo) -> None:
    """Put back, last change first, what ``apply_*`` overwrote."""
    for index, held in reversed(changes):
        logits.index_put_(index, held)


def _index(
    logits: torch.Tensor, row_ids: np.ndarray, token_ids: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor]:
    dev = logits.device
    return torch.from_numpy(row_ids).to(dev), torch.from_numpy(token_ids).to(dev)
