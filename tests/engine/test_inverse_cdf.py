"""`inverse_cdf_rows`: the sampler's draw from each row's softmax at one uniform a row."""

from __future__ import annotations

import pytest
import torch

from worker.engine.sampling_ops import inverse_cdf_rows

INF = float("inf")


def draw(logits: list[list[float]], u: list[float]) -> list[int]:
    x = torch.tensor(logits, dtype=torch.float32)
    return inverse_cdf_rows(x, torch.tensor(u, dtype=torch.float32)[:, None]).tolist()


@pytest.mark.parametrize("vocab", [3, 511, 49152 + 77])
def test_frequencies_follow_the_softmax(vocab: int) -> None:
    g = torch.Generator().manual_seed(vocab)
    row = torch.randn(vocab, generator=g) * 2
    row[torch.rand(vocab, generator=g) < 0.3] = -INF  # masked: never drawn
    row[0] = 4.0
    # 500 rows at a time (40,000 of 49,229 would be 7.9 GB); fewer draws of the wide row: 1.7 s
    n, chunk = (40_000 if vocab < 10_000 else 8_000), 500
    ids = torch.cat(
        [
            inverse_cdf_rows(row.repeat(chunk, 1), torch.rand(chunk, 1, generator=g))
            for _ in range(n // chunk)
        ]
    )
    p = torch.softmax(row.double(), dim=-1)
    counts = torch.bincount(ids, minlength=vocab).double()
    assert counts[p == 0].sum() == 0
    # Pearson's chi-square over the tokens expected 20+ times, the rest pooled: its mean is the
    # degrees of freedom and its sd sqrt(2 dof); 6 sd is far past chance.
    big = n * p >= 20
    expected = torch.cat([n * p[big], (n * p[~big]).sum().reshape(1)])
    observed = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    keep = expected > 0
    chi2 = (((observed - expected) ** 2)[keep] / expected[keep]).sum().item()
    dof = int(keep.sum()) - 1
    assert chi2 < dof + 6 * (2 * dof) ** 0.5, (chi2, dof)


def test_each_uniform_picks_the_interval_it_falls_in() -> None:
    # softmax of (0, 0, -inf, 0) is (1/3, 1/3, 0, 1/3): u in [0, 1/3) -> 0, [1/3, 2/3) -> 1, the
    # rest -> 3; the masked 2 has an empty interval.
    row = [0.0, 0.0, -INF, 0.0]
    assert draw([row] * 5, [0.0, 0.33, 0.34, 0.66, 0.67]) == [0, 0, 1, 1, 3]


def test_zero_mass_is_never_drawn_at_the_ends() -> None:
    # u = 0 skips a masked first token; u just under 1 (u * total can round up to the total)
    # stops at the last token with mass, not the masked ones after it.
    assert draw([[-INF, 1.0, 2.0, -INF, -INF]], [0.0]) == [1]
    assert draw([[0.0, 0.3, -INF, -INF]], [1 - 2**-24]) == [1]
    assert draw([[5.0, -INF]], [0.999999]) == [0]


def test_a_row_with_nothing_allowed_gives_index_zero_not_nan() -> None:
    assert draw([[-INF] * 4, [0.0, -INF, 1.0, -INF]], [0.5, 0.99]) == [0, 2]


def test_rows_are_drawn_alone_and_the_input_is_overwritten() -> None:
    x = torch.tensor([[0.0, 10.0, 0.0], [10.0, 0.0, 0.0]])
    kept = x.clone()
    ids = inverse_cdf_rows(x, torch.tensor([[0.5], [0.5]]))
    assert ids.tolist() == [1, 0] and ids.dtype == torch.long
    assert not torch.equal(x, kept)  # its CDF now: callers pass a copy they own
