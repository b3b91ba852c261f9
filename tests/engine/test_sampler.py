from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from worker.engine.sampler import Sampler, SamplingRequest, _apply_top_p, step_seed
from worker.engine.sampling_params import InvalidSamplingParams, SamplingParams

EOS = 2
V = 997  # odd, and wider than the 256 top-p candidates


def req(output_index: int = 0, **kwargs: Any) -> SamplingRequest:
    return SamplingRequest(SamplingParams(**kwargs), output_index)


def sample(logits: torch.Tensor, requests: list[SamplingRequest], seed: int = 0) -> list[int]:
    return Sampler([EOS], seed=seed)(logits, requests).token_ids


def random_logits(rows: int, vocab: int = V, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def counts(tokens: list[int], vocab: int) -> torch.Tensor:
    return torch.bincount(torch.tensor(tokens), minlength=vocab).double()


def assert_matches(observed: torch.Tensor, probs: torch.Tensor) -> None:
    """Pearson chi-square over the tokens with mass; fixed seeds keep it deterministic, and the
    bound (df + 6 sqrt(2 df) + 10) sits far in the tail, so a correct sampler passes with margin."""
    n = observed.sum()
    assert observed[probs == 0].sum() == 0, "sampled a filtered-out token"
    mask = probs > 0
    expected = probs[mask] * n
    chi2 = float(((observed[mask] - expected) ** 2 / expected).sum())
    df = int(mask.sum()) - 1
    assert chi2 < df + 6 * math.sqrt(2 * df) + 10, (chi2, df)


def test_greedy_is_argmax_and_never_mutates_logits() -> None:
    logits = random_logits(7)
    requests = [req(temperature=0.0, min_tokens=3, max_tokens=5) for _ in range(7)]
    logits[:, EOS] = 100.0  # masked: output_index 0 < min_tokens
    before = logits.clone()
    expected = logits.clone()
    expected[:, EOS] = float("-inf")
    assert sample(logits, requests) == expected.argmax(dim=-1).tolist()
    assert torch.equal(logits, before)
    assert sample(before, [req(temperature=0.0)] * 7) == [EOS] * 7


@pytest.mark.parametrize("params", [{"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}])
def test_filters_that_keep_one_token_equal_greedy(params: dict[str, Any]) -> None:
    logits = random_logits(9, scale=1.0)
    greedy = logits.argmax(dim=-1).tolist()
    for seed in range(3):
        assert sample(logits, [req(temperature=1.5, **params) for _ in range(9)], seed) == greedy


def test_temperature_one_matches_softmax() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, 1.5, 0.2, -0.5, 3.0])
    n = 20_000
    tokens = sample(logits.expand(n, -1), [req()] * n)
    assert_matches(counts(tokens, 10), logits.double().softmax(-1))


def test_seeded_rows_match_softmax_too() -> None:
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0, 0.5])
    n = 5_000
    tokens = sample(logits.expand(n, -1), [req(i % 7, seed=i) for i in range(n)])
    assert_matches(counts(tokens, 5), logits.double().softmax(-1))


def test_temperature_and_top_k_renormalise_over_the_k_best() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, 1.5, 0.2, -0.5, 3.0])
    n = 20_000
    tokens = sample(logits.expand(n, -1), [req(temperature=0.7, top_k=4)] * n)
    expected = (logits.double() / 0.7).softmax(-1)
    expected[expected.argsort(descending=True)[4:]] = 0
    assert_matches(counts(tokens, 10), expected / expected.sum())


def test_min_p_keeps_tokens_at_least_min_p_of_the_top() -> None:
    probs = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    n = 10_000
    tokens = sample(probs.log().expand(n, -1), [req(min_p=0.3)] * n)
    expected = torch.where(probs >= 0.12, probs, 0.0).double()  # 0.3 * 0.4
    assert_matches(counts(tokens, 5), expected / expected.sum())


@pytest.mark.parametrize(("top_p", "kept"), [(0.45, 1), (0.75, 2), (0.85, 3), (0.99, 5)])
def test_top_p_keeps_the_smallest_prefix_reaching_top_p(top_p: float, kept: int) -> None:
    probs = torch.tensor([0.02, 0.5, 0.08, 0.3, 0.1])  # sorted: 0.5 0.3 0.1 0.08 0.02
    n = 4_000
    tokens = set(sample(probs.log().expand(n, -1), [req(top_p=top_p)] * n))
    assert tokens == set(probs.argsort(descending=True)[:kept].tolist())


def reference_nucleus(row: torch.Tensor, top_p: float) -> set[int]:
    probs = row.double().softmax(-1)
    order = probs.argsort(descending=True)
    before = probs[order].cumsum(0) - probs[order]
    return set(order[before < top_p].tolist())


@pytest.mark.parametrize("top_k", [0, 40, 600])
def test_top_p_wide_and_narrow_nuclei_equal_a_float64_reference(top_k: int) -> None:
    # Flat rows have nuclei of hundreds of tokens (past the 256 candidates: the sort fallback),
    # peaked rows a few; one batch mixes both, and a row without top-p.
    logits = torch.cat([random_logits(3, scale=0.3), random_logits(3, seed=1, scale=6.0)])
    params = [SamplingParams(top_p=0.5, top_k=top_k)] * 5 + [SamplingParams(top_k=top_k)]
    x = logits.clone()
    if top_k:
        x[x < x.topk(top_k).values[:, -1:]] = float("-inf")
    expected = x.clone()
    _apply_top_p(x, params)
    sizes = []
    for r in range(5):
        kept = set(torch.nonzero(x[r] > float("-inf")).squeeze(1).tolist())
        assert kept == reference_nucleus(expected[r], 0.5), r
        sizes.append(len(kept))
    assert torch.equal(x[5], expected[5])
    assert max(sizes) > 256 or top_k, sizes  # the fallback ran
    assert min(sizes) < 10, sizes


def test_seeded_row_ignores_batch_mates_and_position() -> None:
    vocab = 4_099  # flat rows: top-p nuclei of thousands, so the full-sort fallback runs too
    row = random_logits(1, vocab, seed=5, scale=1.0)
    variants: list[dict[str, Any]] = [
        {"seed": 42},
        {"seed": 42, "top_p": 0.9},
        {"seed": 42, "top_k": 50, "temperature": 0.8},
        {"seed": 42, "min_p": 0.001, "top_p": 0.95},
    ]
    others = [req(temperature=0.0), req(top_p=0.3), req(top_k=7), req(seed=1), req(logprobs=2)]
    batches = {
        pos: torch.cat([random_logits(pos, vocab, seed=10), row, random_logits(5 - pos, vocab)])
        for pos in (0, 3, 5)
    }
    for params in variants:
        for index in (0, 17):
            target = req(index, **params)
            alone = sample(row, [target])[0]
            for pos, batch in batches.items():
                mates = [*others[:pos], target, *others[pos:]]
                assert sample(batch, mates, seed=pos)[pos] == alone, (params, index, pos)


def test_seeded_request_resumes_at_any_output_index() -> None:
    logits = random_logits(1, seed=3, scale=0.5)
    sampler = Sampler([EOS], seed=0)
    run = [sampler(logits, [req(i, seed=7)]).token_ids[0] for i in range(30)]
    resumed = [Sampler([EOS], seed=9)(logits, [req(i, seed=7)]).token_ids[0] for i in range(12, 30)]
    assert resumed == run[12:]
    assert len(set(run)) > 5  # the index moves the noise: not one token repeated
    assert run != [sample(logits, [req(i, seed=8)])[0] for i in range(30)]
    assert step_seed(7, 0) != step_seed(7, 1) != step_seed(8, 0)


def test_unseeded_rows_depend_on_the_sampler_seed_only() -> None:
    logits = random_logits(16, scale=0.3)
    assert sample(logits, [req()] * 16, seed=1) == sample(logits, [req()] * 16, seed=1)
    assert sample(logits, [req()] * 16, seed=1) != sample(logits, [req()] * 16, seed=2)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_tokens_masks_eos_and_stop_ids_until_reached(temperature: float) -> None:
    logits = torch.zeros(1, 8)
    logits[0, EOS] = 50.0
    logits[0, 5] = 40.0
    logits[0, 6] = 30.0
    common = {"temperature": temperature, "min_tokens": 3, "stop_token_ids": (5,)}
    for ignore_eos in (False, True):
        p = {**common, "ignore_eos": ignore_eos}
        assert sample(logits, [req(2, **p)]) == [6]
        assert sample(logits, [req(3, **p)]) == [EOS]
    masked_stop = logits.clone()
    masked_stop[0, EOS] = 0.0
    assert sample(masked_stop, [req(2, **common)]) == [6]
    assert sample(masked_stop, [req(3, **common)]) == [5]


def test_logprobs_come_from_raw_logits_with_rank_and_top_n() -> None:
    logits = random_logits(4, vocab=50)
    requests = [
        req(logprobs=3, temperature=0.5, top_k=5),
        req(temperature=0.0),
        req(logprobs=0, seed=3, min_tokens=2, max_tokens=4),
        req(logprobs=20, temperature=0.0),
    ]
    out = Sampler([EOS], seed=0)(logits, requests)
    raw = logits.double().log_softmax(-1)
    assert out.logprobs[1] is None
    for i in (0, 2, 3):
        lp = out.logprobs[i]
        assert lp is not None
        token = out.token_ids[i]
        assert lp.token_id == token
        assert lp.logprob == pytest.approx(float(raw[i, token]), abs=1e-5)
        assert lp.rank == 1 + int((raw[i] > raw[i, token] + 1e-9).sum())
        n = requests[i].params.logprobs
        assert len(lp.top) == n
        expected_ids = raw[i].argsort(descending=True)[:n].tolist()
        assert [t for t, _ in lp.top] == expected_ids
        for t, value in lp.top:
            assert value == pytest.approx(float(raw[i, t]), abs=1e-5)
    greedy = out.logprobs[3]
    assert greedy is not None and greedy.rank == 1 and greedy.top[0][0] == out.token_ids[3]


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": -0.1},
        {"top_k": -2},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"min_p": 1.1},
        {"logprobs": 21},
        {"min_tokens": 5, "max_tokens": 4},
    ],
)
def test_invalid_params_raise(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidSamplingParams):
        SamplingParams(**bad)


def test_stop_token_outside_the_vocabulary_raises() -> None:
    with pytest.raises(InvalidSamplingParams):
        sample(torch.zeros(1, 8), [req(stop_token_ids=(8,))])


def test_bad_shapes_and_indices_raise() -> None:
    with pytest.raises(ValueError):
        sample(torch.zeros(2, 8), [req()])
    with pytest.raises(ValueError):
        sample(torch.zeros(1, 8), [req(-1)])
    with pytest.raises(ValueError):
        Sampler([-1])
