"""Turn one step's logits into one token per request, with vLLM's sampling semantics.

Pipeline per row: mask EOS/stop ids until ``min_tokens`` → greedy rows take the argmax →
random rows divide by temperature, drop tokens below the min-p and top-k thresholds, then below the
top-p threshold, and race exponential noise (``argmax(logit - log E)``, E ~ Exp(1): the Gumbel-max
trick, an exact sample from the softmax of what is left, up to float32 uniforms). Logprobs come
from the raw logits.

Seeded rows draw their noise from a generator seeded with ``step_seed(seed, output_index)`` alone,
so a seeded request gives the same tokens whatever shares its batch, and a request resumed at any
``output_index`` (after preemption or a crash) continues exactly where it left off.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from worker.engine.sampling_params import InvalidSamplingParams, SamplingParams

# Temperatures below this are greedy, as in vLLM: dividing logits by ~1e-6 overflows nothing in
# float32 but makes the softmax a one-hot anyway, and argmax is cheaper.
_GREEDY_TEMPERATURE = 1e-5
_MASK64 = (1 << 64) - 1
# Top-p first looks for the nucleus among each row's 256 largest logits (topk(256) of 64 x 49152
# measured ~16 ms on 2 cores, a full sort ~250 ms) and sorts only the rows whose nucleus is wider.
_TOP_P_CANDIDATES = 256


@dataclass(frozen=True)
class SamplingRequest:
    """One row of the logits batch."""

    params: SamplingParams
    output_index: int  # tokens this request has generated so far (the one sampled now is this +1)


@dataclass(frozen=True)
class TokenLogprobs:
    """Logprobs of one sampled token, from ``log_softmax`` of the raw logits."""

    token_id: int
    logprob: float
    rank: int  # 1 + number of tokens strictly more likely than the sampled one
    top: tuple[tuple[int, float], ...]  # the params.logprobs most likely (token_id, logprob)


@dataclass
class SamplerOutput:
    token_ids: list[int]  # one per row
    logprobs: list[TokenLogprobs | None]  # None where params.logprobs is None


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def step_seed(seed: int, output_index: int) -> int:
    """The generator seed for a seeded request's token number ``output_index``."""
    return _splitmix64(_splitmix64(seed & _MASK64) ^ (output_index & _MASK64)) >> 1


def choice_seed(seed: int, index: int) -> int:
    """The seed of choice ``index`` of a request with ``n > 1``; choice 0 keeps ``seed``."""
    if index == 0:
        return seed
    # Mixed rather than seed + index, which would make seed 5's choice 1 repeat seed 6's
    # choice 0.
    return _splitmix64((seed & _MASK64) ^ _splitmix64(index & _MASK64)) >> 1


class Sampler:
    """Samples one token per row; stateless apart from the generator of unseeded rows."""

    def __init__(self, eos_token_ids: Sequence[int], seed: int | None = None) -> None:
        if any(t < 0 for t in eos_token_ids):
            raise ValueError(f"EOS token ids must be >= 0, got {list(eos_token_ids)}")
        self.eos_token_ids = tuple(eos_token_ids)
        self._seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}  # for unseeded rows
        self._row_generators: dict[torch.device, torch.Generator] = {}  # reseeded per seeded row

    def __call__(self, logits: torch.Tensor, requests: Sequence[SamplingRequest]) -> SamplerOutput:
        """Sample ``logits`` (N, V) float32, row i under ``requests[i]``."""
        if logits.dim() != 2 or logits.shape[0] != len(requests):
            raise ValueError(f"logits {tuple(logits.shape)} do not match {len(requests)} requests")
        raw = logits
        logits = self._mask_min_tokens(logits, requests)
        greedy = [r.params.temperature < _GREEDY_TEMPERATURE for r in requests]
        if all(greedy):
            token_ids = logits.argmax(dim=-1)
        else:
            token_ids = torch.empty(len(requests), dtype=torch.long, device=logits.device)
            rand_rows = [i for i, g in enumerate(greedy) if not g]
            if len(rand_rows) < len(requests):
                greedy_rows = torch.tensor(
                    [i for i, g in enumerate(greedy) if g], device=logits.device
                )
                token_ids[greedy_rows] = logits[greedy_rows].argmax(dim=-1)
            rand_requests = [requests[i] for i in rand_rows]
            rows_t = torch.tensor(rand_rows, device=logits.device)
            x = logits if len(rand_rows) == len(requests) else logits[rows_t]
            token_ids[rows_t] = self._sample_random(x, rand_requests)
        ids = token_ids.tolist()
        return SamplerOutput(token_ids=ids, logprobs=_logprobs(raw, ids, requests))

    def _mask_min_tokens(
        self, logits: torch.Tensor, requests: Sequence[SamplingRequest]
    ) -> torch.Tensor:
        """A copy of ``logits`` with EOS and stop ids at -inf in rows below min_tokens."""
        vocab = logits.shape[1]
        rows: list[int] = []
        cols: list[int] = []
        for i, r in enumerate(requests):
            if r.output_index < 0:
                raise ValueError(f"output_index must be >= 0, got {r.output_index}")
            if any(not 0 <= t < vocab for t in r.params.stop_token_ids):
                raise InvalidSamplingParams(
                    f"invalid sampling parameter stop_token_ids: each must be in 0..{vocab - 1}"
                )
            if r.output_index < r.params.min_tokens:
                banned = {t for t in (*self.eos_token_ids, *r.params.stop_token_ids) if t < vocab}
                rows += [i] * len(banned)
                cols += banned
        if not rows:
            return logits
        logits = logits.clone()
        dev = logits.device
        logits[torch.tensor(rows, device=dev), torch.tensor(cols, device=dev)] = float("-inf")
        return logits

    def _sample_random(self, x: torch.Tensor, requests: Sequence[SamplingRequest]) -> torch.Tensor:
        """Temperature, min-p and top-k, top-p, then the exponential race; x (R, V)."""
        params = [r.params for r in requests]
        temps = torch.tensor([p.temperature for p in params], device=x.device)
        x = x.float() / temps[:, None]  # (R, V) float32, a fresh tensor we may change in place
        threshold = _max(_min_p_threshold(x, params), _top_k_threshold(x, params))
        if threshold is not None:  # min-p and top-k commute: one pass keeps x >= both thresholds
            x.masked_fill_(x < threshold[:, None], float("-inf"))
        _apply_top_p(x, params)
        # Gumbel-max: argmax(x + G), G = -log(E), E = -log(U) ~ Exp(1). torch.rand plus two logs
        # measured ~14 ms at 64 x 49152 on 2 cores, exponential_() ~63 ms.
        return x.sub_(self._uniform(x, requests).log_().neg_().log_()).argmax(dim=-1)

    def _uniform(self, x: torch.Tensor, requests: Sequence[SamplingRequest]) -> torch.Tensor:
        """U[0, 1) like x: seeded rows from (seed, output_index) alone, the rest batched."""
        dev = x.device
        noise = torch.empty_like(x)
        seeded = [i for i, r in enumerate(requests) if r.params.seed is not None]
        if len(seeded) < len(requests):
            noise.uniform_(generator=self._generator(dev))
        if seeded:
            gen = self._row_generators.get(dev) or torch.Generator(device=dev)
            self._row_generators[dev] = gen
            for i in seeded:
                seed = requests[i].params.seed
                assert seed is not None
                gen.manual_seed(step_seed(seed, requests[i].output_index))
                noise[i].uniform_(generator=gen)
        # U = 0 gives E = inf and x - log(E) = -inf: that token loses, never NaN.
        return noise

    def _generator(self, device: torch.device) -> torch.Generator:
        gen = self._generators.get(device)
        if gen is None:
            gen = torch.Generator(device=device)
            if self._seed is None:
                gen.seed()
            else:
                gen.manual_seed(self._seed)
            self._generators[device] = gen
        return gen


def _max(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    if a is None or b is None:
        return b if a is None else a
    return torch.maximum(a, b)


def _min_p_threshold(x: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor | None:
    """Per-row logit below which p < min_p * p_max, i.e. max + log(min_p); (R,) or None."""
    if all(p.min_p == 0.0 for p in params):
        return None
    min_p = torch.tensor([p.min_p for p in params], device=x.device, dtype=x.dtype)
    return x.amax(dim=-1) + min_p.log()  # log(0) = -inf keeps every token of rows without min-p


def _top_k_threshold(x: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor | None:
    """Per-row k-th largest logit (ties kept, as vLLM); -inf where top-k is off; (R,) or None."""
    vocab = x.shape[1]
    ks = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
    k_max = max(ks)
    if k_max == 0:
        return None
    values = x.topk(k_max, dim=-1, sorted=True).values  # (R, k_max); no full sort
    k = torch.tensor([max(k, 1) for k in ks], device=x.device)
    threshold = values.gather(1, (k - 1)[:, None]).squeeze(1)
    off = torch.tensor([k == 0 for k in ks], device=x.device)
    return threshold.masked_fill_(off, float("-inf"))


def _apply_top_p(x: torch.Tensor, params: Sequence[SamplingParams]) -> None:
    """Mask, in place, all but each top-p row's nucleus (vLLM's rule; ties at its edge kept).

    The nucleus: the most likely tokens until the mass before the next reaches top_p.
    """
    rows = [i for i, p in enumerate(params) if p.top_p < 1.0]
    if not rows:
        return
    rows_t = torch.tensor(rows, device=x.device)
    sub = x if len(rows) == x.shape[0] else x[rows_t]  # (P, V)
    top_p = torch.tensor([params[i].top_p for i in rows], device=x.device, dtype=x.dtype)
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


def _logprobs(
    raw: torch.Tensor, token_ids: list[int], requests: Sequence[SamplingRequest]
) -> list[TokenLogprobs | None]:
    """Sampled and top-N logprobs from log_softmax of the raw logits (vLLM's default)."""
    out: list[TokenLogprobs | None] = [None] * len(requests)
    rows = [i for i, r in enumerate(requests) if r.params.logprobs is not None]
    if not rows:
        return out
    rows_t = torch.tensor(rows, device=raw.device)
    lp = raw[rows_t].float().log_softmax(dim=-1)  # (L, V)
    sampled_t = torch.tensor([token_ids[i] for i in rows], device=raw.device)[:, None]
    sampled_lp = lp.gather(1, sampled_t)  # (L, 1)
    ranks = ((lp > sampled_lp).sum(dim=-1) + 1).tolist()
    n_max = max(requests[i].params.logprobs or 0 for i in rows)
    top_lp, top_ids = lp.topk(n_max, dim=-1) if n_max else (lp[:, :0], sampled_t[:, :0])
    top_lp_l, top_ids_l, sampled_l = top_lp.tolist(), top_ids.tolist(), sampled_lp[:, 0].tolist()
    for j, i in enumerate(rows):
        n = requests[i].params.logprobs or 0
        top = tuple(zip(top_ids_l[j][:n], top_lp_l[j][:n], strict=True))
        out[i] = TokenLogprobs(token_ids[i], sampled_l[j], ranks[j], top)
    return out
