"""Turn one step's logits into one token per request, with vLLM's sampling semantics.

Pipeline per row: mask EOS/stop ids until ``min_tokens`` → greedy rows take the argmax →
random rows divide by temperature, drop tokens below the min-p and top-k thresholds, then below the
top-p threshold, and draw from the softmax of what is left by inverting its CDF at one uniform a
row (``sampling_ops.inverse_cdf_rows``: an exact sample up to float32 rounding). Logprobs come
from the raw logits.

Seeded rows draw their uniform from a generator seeded with ``step_seed(seed, output_index)`` alone,
so a seeded request gives the same tokens whatever shares its batch, and a request resumed at any
``output_index`` (after preemption or a crash) continues exactly where it left off.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from worker.engine.grammar_compiles import GrammarCompiles
from worker.engine.logits_rows import RowProcessors
from worker.engine.penalties import undo
from worker.engine.sampling_ops import (
    apply_min_p_top_k,
    apply_top_p,
    argmax_rows,
    inverse_cdf_rows,
    row_values,
)
from worker.engine.sampling_params import InvalidSamplingParams
from worker.engine.sampling_rows import (
    GREEDY_TEMPERATURE,
    LOGPROBS,
    MIN_TOKENS,
    PROCESSED,
    RANDOM,
    SamplingRequest,
    flags_of,
)

_MASK64 = (1 << 64) - 1
_apply_top_p = apply_top_p  # its tests import it from here
__all__ = ["Sampler", "SamplerOutput", "SamplingRequest", "TokenLogprobs", "choice_seed"]


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

    def __init__(
        self,
        eos_token_ids: Sequence[int],
        seed: int | None = None,
        grammars: GrammarCompiles | None = None,
        max_model_len: int | None = None,
    ) -> None:
        if any(t < 0 for t in eos_token_ids):
            raise ValueError(f"EOS token ids must be >= 0, got {list(eos_token_ids)}")
        self.eos_token_ids = tuple(eos_token_ids)
        self._seed = seed
        # Structure constraints, penalties and biases: state per sequence (``logits_rows``).
        self.rows = RowProcessors(self.eos_token_ids, grammars, max_model_len)
        self._generators: dict[torch.device, torch.Generator] = {}  # for unseeded rows
        self._row_generators: dict[torch.device, torch.Generator] = {}  # reseeded per seeded row

    @torch.inference_mode()  # the runner's logits are inference tensors, masked in place here
    def __call__(self, logits: torch.Tensor, requests: Sequence[SamplingRequest]) -> SamplerOutput:
        """Sample ``logits`` (N, V) float32, row i under ``requests[i]``; ``logits`` is the same
        on return (min-tokens masking, biases and penalties are undone) but for the constrained
        rows' grammar masks, and logprobs come from it."""
        ids = self.sample_ids(logits, requests).tolist()
        return SamplerOutput(token_ids=ids, logprobs=self.logprobs(logits, ids, requests))

    @torch.inference_mode()
    def sample_ids(self, logits: torch.Tensor, requests: Sequence[SamplingRequest]) -> torch.Tensor:
        """The sampled ids ``(N,)`` on the logits' device, without waiting for them: the
        overlapped loop copies them to the host once, while the next step is prepared."""
        if logits.dim() != 2 or logits.shape[0] != len(requests):
            raise ValueError(f"logits {tuple(logits.shape)} do not match {len(requests)} requests")
        flags = flags_of(requests)  # the passes no row needs are skipped
        changes = self.rows.process(logits, requests) if flags & PROCESSED else None
        held = None
        if flags & MIN_TOKENS:
            held = self._mask_min_tokens(logits, requests, changes.forced_stop if changes else ())
        try:
            return self._pick(logits, requests) if flags & RANDOM else argmax_rows(logits)
        finally:
            if held is not None:
                logits.index_put_(held[0], held[1])
            if changes is not None:
                undo(logits, changes.undo)

    @staticmethod
    def logprobs(
        logits: torch.Tensor, token_ids: list[int], requests: Sequence[SamplingRequest]
    ) -> list[TokenLogprobs | None]:
        """Each row's `TokenLogprobs` for ``token_ids`` (None where not asked)."""
        return _logprobs(logits, token_ids, requests)

    def _pick(self, logits: torch.Tensor, requests: Sequence[SamplingRequest]) -> torch.Tensor:
        """One token id per row, (N,)."""
        greedy = [r.params.temperature < GREEDY_TEMPERATURE for r in requests]
        if all(greedy):
            return argmax_rows(logits)
        n, dev = len(requests), logits.device
        rand_rows = [i for i, g in enumerate(greedy) if not g]
        if len(rand_rows) == n:
            return self._sample_random(logits, requests, owned=False)
        greedy_rows = [i for i, g in enumerate(greedy) if g]
        # Copying a row out costs ~4x its share of the whole batch's argmax (256 x 49152 fp32,
        # 2 cores: 128 rows copied 6.1 ms, argmax_rows of all 256 3.0 ms): past a quarter of the
        # rows, argmax them all and overwrite the random ones.
        if 4 * len(greedy_rows) >= n:
            token_ids = argmax_rows(logits)
        else:
            token_ids = torch.empty(n, dtype=torch.long, device=dev)
            greedy_t = row_values(greedy_rows, dev)
            token_ids[greedy_t] = argmax_rows(logits[greedy_t])
        rows_t = row_values(rand_rows, dev)
        rand_requests = [requests[i] for i in rand_rows]
        token_ids[rows_t] = self._sample_random(logits[rows_t], rand_requests, owned=True)
        return token_ids

    def _mask_min_tokens(
        self,
        logits: torch.Tensor,
        requests: Sequence[SamplingRequest],
        exempt: Collection[int] = (),
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor] | None:
        """Set EOS and stop ids to -inf, in place, in rows below min_tokens but those ``exempt``
        (whose grammar allows nothing else); return the indices and the values they held, to
        put back. Masked in place rather than in a copy: a clone of 256 x 49152 fp32 logits
        took 26 ms on 2 cores, longer than sampling them."""
        vocab = logits.shape[1]
        rows: list[int] = []
        cols: list[int] = []
        for i, r in enumerate(requests):
            if r.output_index < 0:
                raise ValueError(f"output_index must be >= 0, got {r.output_index}")
            stop_ids = r.params.stop_token_ids
            if stop_ids and any(not 0 <= t < vocab for t in stop_ids):
                raise InvalidSamplingParams(
                    f"invalid sampling parameter stop_token_ids: each must be in 0..{vocab - 1}"
                )
            if r.output_index < r.params.min_tokens and i not in exempt:
                banned = {t for t in (*self.eos_token_ids, *stop_ids) if t < vocab}
                rows += [i] * len(banned)
                cols += banned
        if not rows:
            return None
        dev = logits.device
        index = (row_values(rows, dev), row_values(cols, dev))
        held = logits[index]  # a copy: one value per (row, id), all distinct
        logits[index] = float("-inf")
        return index, held

    def _sample_random(
        self, x: torch.Tensor, requests: Sequence[SamplingRequest], owned: bool
    ) -> torch.Tensor:
        """Temperature, min-p and top-k, top-p, then the draw; x (R, V), which may be changed in
        place if ``owned``."""
        params = [r.params for r in requests]
        temps = row_values([p.temperature for p in params], x.device)[:, None]
        # (R, V) float32, a fresh tensor we may change in place. One we own already (a gathered
        # copy) is divided in place: an allocation fewer, ~0.05 ms a row of 49152 on 2 cores.
        y = x.float()
        x = y.div_(temps) if owned or y is not x else y / temps
        apply_min_p_top_k(x, params)
        apply_top_p(x, params)
        return inverse_cdf_rows(x, self._uniform(x, requests))

    def _uniform(self, x: torch.Tensor, requests: Sequence[SamplingRequest]) -> torch.Tensor:
        """U[0, 1), one a row, (R, 1): seeded rows from (seed, output_index) alone, the rest
        batched."""
        dev = x.device
        u = torch.empty((x.shape[0], 1), dtype=x.dtype, device=dev)
        seeded = [i for i, r in enumerate(requests) if r.params.seed is not None]
        if len(seeded) < len(requests):
            u.uniform_(generator=self._generator(dev))
        if seeded:
            gen = self._row_generators.get(dev) or torch.Generator(device=dev)
            self._row_generators[dev] = gen
            for i in seeded:
                seed = requests[i].params.seed
                assert seed is not None
                gen.manual_seed(step_seed(seed, requests[i].output_index))
                u[i].uniform_(generator=gen)
        return u

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


def _logprobs(
    raw: torch.Tensor, token_ids: list[int], requests: Sequence[SamplingRequest]
) -> list[TokenLogprobs | None]:
    """Sampled and top-N logprobs from log_softmax of the raw logits (vLLM's default)."""
    out: list[TokenLogprobs | None] = [None] * len(requests)
    if not flags_of(requests) & LOGPROBS:
        return out
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
