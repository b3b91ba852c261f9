"""`argmax_rows` is `torch.argmax` (ties, NaN, infinities, strides), and the sampler built on it
leaves the runner's logits as they were."""

from __future__ import annotations

import pytest
import torch

from worker.engine.sampler import Sampler, SamplingRequest
from worker.engine.sampling_ops import argmax_rows
from worker.engine.sampling_params import SamplingParams

EOS = 2


def odd_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g)
    if seed % 2:
        x = x.round()  # many ties, some across chunks
    if seed % 3 == 0:
        x[x > 1.5] = float("inf")
    if seed % 5 == 0:
        x[torch.rand(rows, vocab, generator=g) < 0.002] = float("nan")
    if seed % 7 == 0:
        x[0] = float("-inf")
    return x


@pytest.mark.parametrize("vocab", [1, 511, 1024, 1500, 49152, 49152 + 77])
@pytest.mark.parametrize("seed", range(8))
def test_argmax_rows_equals_torch_argmax(vocab: int, seed: int) -> None:
    x = odd_logits(5, vocab, seed)
    assert torch.equal(argmax_rows(x), x.argmax(dim=-1))
    strided = x.t().contiguous().t()  # column-major: the plain argmax path
    assert torch.equal(argmax_rows(strided), x.argmax(dim=-1))
    wide = torch.cat([x, x], dim=1)[:, :vocab]  # rows with a stride longer than the row
    assert torch.equal(argmax_rows(wide), x.argmax(dim=-1))


def test_the_first_of_equal_maxima_wins_across_chunks() -> None:
    x = torch.zeros(3, 4096)
    x[0, [100, 3000]] = 5.0
    x[1, [4095, 600]] = 5.0
    x[2, [513, 512]] = float("nan")
    assert argmax_rows(x).tolist() == [100, 600, 512]


def test_sampler_restores_inference_logits_and_keeps_raw_logprobs() -> None:
    vocab = 49152
    with torch.inference_mode():  # as the runner makes them
        logits = odd_logits(6, vocab, seed=4) * 3
        logits[:, EOS] = 100.0
    before = logits.clone()
    params = [
        SamplingParams(temperature=0.0, min_tokens=2, logprobs=1),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, top_p=0.9, seed=3, min_tokens=2),
        SamplingParams(temperature=0.0, min_tokens=2),
        SamplingParams(temperature=1.0, min_tokens=2, logprobs=0),
        SamplingParams(temperature=0.0, logprobs=2),
    ]
    out = Sampler([EOS], seed=0)(logits, [SamplingRequest(p, 0) for p in params])
    assert torch.equal(logits, before)
    masked = before.clone()
    masked[[0, 2, 3, 4], EOS] = float("-inf")
    greedy = masked.argmax(dim=-1).tolist()
    assert [out.token_ids[i] for i in (0, 1, 3, 5)] == [greedy[i] for i in (0, 1, 3, 5)]
    assert out.token_ids[1] == out.token_ids[5] == EOS
    assert EOS not in (out.token_ids[2], out.token_ids[4])
    raw = before.double().log_softmax(dim=-1)
    for i in (0, 4, 5):
        lp = out.logprobs[i]
        assert lp is not None
        assert lp.logprob == pytest.approx(float(raw[i, out.token_ids[i]]), abs=1e-4)
