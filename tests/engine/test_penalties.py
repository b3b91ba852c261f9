"""Penalties and logit_bias (issue 20): batched against a naive per-row reference, vLLM's rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from worker.engine.logits_rows import RowProcessors
from worker.engine.penalties import TokenCounts, undo
from worker.engine.sampler import Sampler, SamplingRequest
from worker.engine.sampling_params import SamplingParams
from worker.engine.sequence import Sequence

VOCAB = 97  # odd, so no row is a multiple of anything


def reference(
    logits: torch.Tensor, prompt: list[int], output: list[int], p: SamplingParams
) -> torch.Tensor:
    """vLLM's order, one row, dense: bias, repetition (prompt + output), frequency, presence."""
    x = logits.clone()
    for token, bias in (p.logit_bias or {}).items():
        x[token] += bias
    seen = torch.zeros(VOCAB, dtype=torch.bool)
    seen[prompt + output] = True
    rep = torch.where(seen, p.repetition_penalty, 1.0)
    x = torch.where(x > 0, x / rep, x * rep)
    counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=VOCAB).float()
    return x - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).float()


def sequence(prompt: list[int], output: list[int], params: SamplingParams) -> Sequence:
    seq = Sequence("r", prompt, params, 0)
    for t in output:
        seq.append_token(t)
    return seq


CASES = [
    SamplingParams(presence_penalty=0.7),
    SamplingParams(frequency_penalty=-1.3),
    SamplingParams(repetition_penalty=1.8),
    SamplingParams(repetition_penalty=0.6, frequency_penalty=0.4, presence_penalty=-0.5),
    SamplingParams(logit_bias={3: 5.0, 50: -100.0, 96: 0.25}),
    SamplingParams(logit_bias={3: -2.0}, repetition_penalty=1.3, frequency_penalty=2.0),
    SamplingParams(),  # a plain row in the same batch: untouched
]


def test_batched_rows_match_the_naive_reference_and_undo_exactly() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(len(CASES), VOCAB, generator=gen) * 3
    raw = logits.clone()
    rows = []
    expected = []
    for i, params in enumerate(CASES):
        prompt = torch.randint(0, VOCAB, (5 + i,), generator=gen).tolist()
        output = torch.randint(0, VOCAB, (3 * i,), generator=gen).tolist()
        rows.append((i, sequence(prompt, output, params), len(output)))
        expected.append(reference(raw[i], prompt, output, params))
    processors = RowProcessors(eos_token_ids=(2,), grammars=None)
    penalized = [r for r in rows if r[1].params.penalized]
    changes = processors.apply(logits, penalized)
    torch.testing.assert_close(logits, torch.stack(expected))
    undo(logits, changes.undo)
    assert torch.equal(logits, raw)


def test_counts_grow_one_token_at_a_time() -> None:
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, VOCAB, 40).tolist()
    output = rng.integers(0, VOCAB, 300).tolist()
    counts = TokenCounts(prompt)
    for t in output:
        counts.add(t)
    got = dict(zip(counts.ids().tolist(), counts.counts().tolist(), strict=True))
    assert set(got) == set(prompt) | set(output)  # each once
    assert got == {t: float(output.count(t)) for t in got}


def test_state_follows_the_sequence_step_by_step() -> None:
    # The processors take in only the new token each step; the result equals a recount.
    p = SamplingParams(frequency_penalty=0.5, repetition_penalty=1.5)
    seq = sequence([1, 2, 3], [], p)
    processors = RowProcessors(eos_token_ids=(2,), grammars=None)
    gen = torch.Generator().manual_seed(2)
    for _ in range(12):
        logits = torch.randn(1, VOCAB, generator=gen)
        raw = logits.clone()
        changes = processors.apply(logits, [(0, seq, seq.num_output_tokens)])
        torch.testing.assert_close(logits[0], reference(raw[0], [1, 2, 3], seq.output_token_ids, p))
        undo(logits, changes.undo)
        seq.append_token(int(torch.randint(0, 6, (1,), generator=gen)))  # repeats, often


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_sampler_draws_from_the_penalized_logits(temperature: float) -> None:
    # A bias of +100 on one token wins every draw; -100 on the argmax removes it.
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(4))
    top = int(logits[2].argmax())
    params = [
        SamplingParams(temperature=temperature, logit_bias={41: 100.0}, seed=1),
        SamplingParams(temperature=temperature, seed=1),
        SamplingParams(temperature=0.0, logit_bias={top: -100.0}),
    ]
    seqs = [sequence([5], [], p) for p in params]
    requests = [SamplingRequest(p, 0, s) for p, s in zip(params, seqs, strict=True)]
    raw = logits.clone()
    out = Sampler([2], seed=0)(logits, requests)
    assert out.token_ids[0] == 41 and out.token_ids[2] != top
    assert torch.equal(logits, raw)  # undone: logprobs come from the raw logits


def test_a_penalized_row_without_its_sequence_is_an_error() -> None:
    with pytest.raises(ValueError, match="needs its sequence"):
        request = SamplingRequest(SamplingParams(presence_penalty=1.0), 0)
        Sampler([2])(torch.zeros(1, VOCAB), [request])
