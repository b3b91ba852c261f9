"""The sampler's row-wise tensor work on a ``(rows, vocab)`` logits batch: the min-p, top-k and
top-p filters, an argmax that finds the same index as ``torch.argmax`` several times faster, and
the draw from each row's softmax by inverting its CDF.

Every function treats each row alone, so a row's result never depends on its batch mates.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from worker.engine.sampling_params import SamplingParams

# Top-p first looks for the nucleus among each row's 256 largest logits (topk(256) of 64 x 49152
# measured ~16 ms on 2 cores, a full sort ~250 ms) and sorts only the rows whose nucleus is wider.
_TOP_P_CANDIDATES = 256
# argmax_rows' chunk: 256 and 512 tie (5.4-5.5 ms at 256 x 49152 fp32 on 1 thread), 2048 takes
# 7.9 ms and 4096 10.8 ms; torch.argmax takes 13.6 ms there.
_ARGMAX_CHUNK = 512


def row_values(
    values: Sequence[float] | Sequence[int], device: torch.device, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``torch.tensor(values, dtype, device)``, one value per row, without a wait on CUDA: made
    in pinned host memory and copied without blocking (a copy from pageable memory waits for
    the queued forward first, so the host could not run ahead). On the CPU the same path, the
    copy a no-op."""
    pinned = device.type == "cuda"
    return torch.tensor(values, dtype=dtype, pin_memory=pinned).to(device, non_blocking=pinned)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(dim=-1)`` for ``x`` (N, V): the first index of each row's maximum (NaN counts as
    the maximum, as in torch). torch's CPU argmax does not vectorise or split a row across
    threads (256 x 49152 fp32, 2 cores: 13-14 ms on 1 or 2 threads), its amax does (2.4 ms): so
    take each chunk's amax, then argmax the few chunk maxima and the one winning chunk per row
    (3.0 ms). The first chunk holding the maximum holds its first index, so ties and NaN resolve
    as in one argmax."""
    vocab = x.shape[1]
    c = _ARGMAX_CHUNK
    k = vocab // c
    # On CUDA argmax is one kernel already; the chunks would only add launches. One row of
    # 49152: argmax 0.056 ms, the chunks 0.067 (4 rows: 0.128 and 0.084).
    if x.shape[0] < 2 or k < 2 or x.stride(1) != 1 or x.device.type != "cpu":
        return x.argmax(dim=-1)
    chunk_max = x[:, : k * c].unflatten(1, (k, c)).amax(dim=-1)  # (N, K); a view, no copy
    if k * c < vocab:  # the shorter last chunk
        chunk_max = torch.cat([chunk_max, x[:, k * c :].amax(dim=-1, keepdim=True)], dim=1)
    start = chunk_max.argmax(dim=-1) * c  # (N,) the winning chunk's first column
    # Past the vocabulary's end the last column repeats: after it, so it never wins a tie.
    cols = (start[:, None] + torch.arange(c, device=x.device)).clamp_(max=vocab - 1)  # (N, C)
    return x.gather(1, cols).argmax(dim=-1) + start


def inverse_cdf_rows(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One index per row of ``x`` (R, V) float32 logits, drawn from the row's softmax by inverting
    its CDF at ``u`` (R, 1), uniform in [0, 1): the first index whose cumulative mass passes
    ``u`` times the total; ``x`` is overwritten (with the unnormalised CDF).

    One uniform a row where the Gumbel-max race drew V and took two logs of each: at 256 x
    49152 on 2 cores 29 ms against 85, of which torch's CPU generator alone took 44 (mt19937,
    one thread). Exact up to float32 rounding of each CDF entry (on the CPU torch accumulates a
    float cumsum in double), as fine as the race's float32 uniforms: a token of zero mass (masked
    to -inf) has an empty interval and is never drawn."""
    # An all -inf row (nothing allowed) gives a zero CDF and index 0, as the race's argmax did.
    peak = x.amax(dim=-1, keepdim=True).clamp_(min=torch.finfo(x.dtype).min)
    cdf = x.sub_(peak).exp_().cumsum_(dim=-1)  # (R, V) non-decreasing
    total = cdf[:, -1:].contiguous()  # (R, 1)
    picked = torch.searchsorted(cdf, u * total, right=True)
    # u * total can round up to the total itself: then the last index with mass, not one past it.
    last = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(picked, last).squeeze(1)


def apply_min_p_top_k(x: torch.Tensor, params: Sequence[SamplingParams]) -> None:
    """Mask, in place, tokens below each row's min-p or top-k threshold."""
    threshold = _max(_min_p_threshold(x, params), _top_k_threshold(x, params))
    if threshold is not None:  # min-p and top-k commute: one pass keeps x >= both thresholds
        x.masked_fill_(x < threshold[:, None], float("-inf"))


def _max(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    if a is None or b is None:
        return b if a is None else a
    return torch.maximum(a, b)


def _min_p_threshold(x: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor | None:
    """Per-row logit below which p < min_p * p_max, i.e. max + log(min_p); (R,) or None."""
    if all(p.min_p == 0.0 for p in params):
        return None
    min_p = row_values([p.min_p for p in params], x.device, x.dtype)
    return x.amax(dim=-1) + min_p.log()  # log(0) = -inf keeps every token of rows without min-p


def _top_k_threshold(x: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor | None:
    """Per-row k-th largest logit (ties kept, as vLLM); -inf where top-k is off; (R,) or None."""
    vocab = x.shape[1]
    ks = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
    k_max = max(ks)
    if k_max == 0:
        return None
    values = x.topk(k_max, dim=-1, sorted=True).values  # (R, k_max); no full sort
    k = row_values([max(k, 1) for k in ks], x.device)
    threshold = values.gather(1, (k - 1)[:, None]).squeeze(1)
    off = row_values([k == 0 for k in ks], x.device)
    return threshold.masked_fill_(off, float("-inf"))


def apply_top_p(x: torch.Tensor, params: Sequence[SamplingParams]) -> None:
    """Mask, in place, all but each top-p row's nucleus (vLLM's rule; ties at its edge kept).

    The nucleus: the most likely tokens until the mass before the next reaches top_p.
    """
    rows = [i for i, p in enumerate(params) if p.top_p < 1.0]
    if not rows:
        return
    rows_t = row_values(rows, x.device)
    sub = x if len(rows) == x.shape[0] else x[rows_t]  # (P, V)
    top_p = row_values([params[i].top_p for i in rows], x.device, x.dtype)
    # Softmax and cumsum reduce each row alone and in a fixed order (a plain sum does not: one row
    # is split across threads), so a seeded row's nucleus does not depend on the batch.
    probs = sub.softmax(dim=-1)
    top_k = [params[i].top_k for i in rows]
    vocab = x.shape[1]
    if all(0 < k < vocab for k in top_k):
        num_candidates = max(top_k) + 1  # past top-k all is masked already
    else:
        num_candidates = min(_TOP_P_CANDIDATES, vocab)
    edge, fits = _nucleus_edge(sub, probs, top_p, num_candidates)
    if not bool(fits.all()):  # a nucleus wider than the candidates: sort those rows in full
        redo = (~fits).nonzero().squeeze(1)
        edge[redo] = _nucleus_edge(sub[redo], probs[redo], top_p[redo], vocab)[0]
    if len(rows) == x.shape[0]:
        x.masked_fill_(x < edge[:, None], float("-inf"))
    else:
        x[rows_t] = sub.masked_fill_(sub < edge[:, None], float("-inf"))


def _nucleus_edge(
    x: torch.Tensor, probs: torch.Tensor, top_p: torch.Tensor, num_candidates: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Smallest logit of each row's nucleus among its num_candidates largest, and whether the
    nucleus ends there (else it may reach past them); both (P,)."""
    if num_candidates < x.shape[1]:
        values, ids = x.topk(num_candidates, dim=-1, sorted=True)  # (P, C)
    else:
        values, ids = x.sort(dim=-1, descending=True)  # (P, V); ~100x slower than topk(256)
    mass = probs.gather(1, ids)
    mass_before = mass.cumsum(dim=-1).sub_(mass)  # sequential: a prefix sums the same at any C
    num_kept = (mass_before < top_p[:, None]).sum(dim=-1)  # a prefix; the first is always kept
    fits = (num_kept < num_candidates) | values[:, -1].isneginf()
    edge = values.gather(1, (num_kept.clamp(min=1) - 1)[:, None]).squeeze(1)
    return edge, fits
