"""A step's flags skip only the sampler passes no row needs: the same tokens and logprobs as a
plain list of requests, which takes every pass."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from worker.engine.sampler import Sampler
from worker.engine.sampling_params import SamplingParams
from worker.engine.sampling_rows import (
    ALL,
    LOGPROBS,
    MIN_TOKENS,
    PROCESSED,
    RANDOM,
    SamplingRequest,
    SamplingRows,
    flags_of,
    row_flags,
)
from worker.engine.sequence import Sequence

EOS = 2
V = 613


@pytest.mark.parametrize(
    ("fields", "flags"),
    [
        ({}, 0),
        ({"temperature": 0.8, "seed": 3}, RANDOM),
        ({"temperature": 1e-6}, 0),  # below the greedy threshold: argmax
        ({"min_tokens": 2}, MIN_TOKENS),
        ({"stop_token_ids": [7]}, MIN_TOKENS),  # its range check runs in that pass
        ({"logprobs": 0}, LOGPROBS),
        ({"presence_penalty": 0.5}, PROCESSED),
        ({"logit_bias": {5: 2.0}}, PROCESSED),
        ({"temperature": 0.7, "logprobs": 2, "min_tokens": 1}, RANDOM | LOGPROBS | MIN_TOKENS),
    ],
)
def test_row_flags_name_the_passes_a_row_needs(fields: dict[str, Any], flags: int) -> None:
    assert row_flags(SamplingParams(**{"temperature": 0.0, **fields})) == flags


def rows(params: list[SamplingParams], output_index: int) -> SamplingRows:
    out = SamplingRows()
    for i, p in enumerate(params):
        seq = Sequence(f"r{i}", [1, 3, 4], p, i)
        seq.token_ids += [5 + i] * output_index  # the tokens it generated so far
        out.append(SamplingRequest(p, output_index, seq))
    for p in params:
        out.flags |= row_flags(p)
    return out


def greedy(**fields: Any) -> SamplingParams:
    return SamplingParams(temperature=0.0, **fields)


MIXES = {
    "greedy": [greedy()] * 5,
    "greedy, min_tokens": [greedy(), greedy(min_tokens=4)] * 3,
    "seeded": [SamplingParams(temperature=0.9, top_p=0.8, seed=s) for s in range(4)],
    "mixed": [
        greedy(),
        SamplingParams(temperature=0.7, top_k=20, seed=1, logprobs=3),
        greedy(frequency_penalty=0.5, logit_bias={EOS: 9.0}),
        greedy(min_tokens=3, stop_token_ids=[11], logprobs=0),
    ],
}


@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("output_index", [0, 5])
def test_flagged_rows_sample_as_the_full_path(mix: str, output_index: int) -> None:
    params = MIXES[mix]
    logits = torch.randn(len(params), V, generator=torch.Generator().manual_seed(7)) * 4
    logits[:, EOS] += 20.0  # EOS wins where it is not masked: min_tokens must show
    logits[:, 11] += 10.0
    flagged = rows(params, output_index)
    assert flags_of(flagged) == flagged.flags
    fast = Sampler([EOS], seed=0)(logits.clone(), flagged)
    full = Sampler([EOS], seed=0)(logits.clone(), list(flagged))
    assert fast.token_ids == full.token_ids
    assert fast.logprobs == full.logprobs
    if mix == "greedy, min_tokens" and output_index == 0:
        assert all(t != EOS for t in fast.token_ids[1::2]) and fast.token_ids[0] == EOS


def test_a_plain_list_takes_every_pass() -> None:
    assert flags_of([SamplingRequest(SamplingParams(), 0)]) == ALL
    assert flags_of(SamplingRows()) == 0
    assert flags_of(rows(MIXES["mixed"], 0)) == ALL
