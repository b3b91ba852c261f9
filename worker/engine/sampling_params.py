"""Per-request sampling parameters, with vLLM's meanings so users need not relearn them."""

from __future__ import annotations

from dataclasses import dataclass

from worker.engine.prompt import InvalidRequestError

# Each choice is a sequence of its own in the batch; 16 keeps one request to a quarter of the
# default 64-sequence batch.
MAX_N = 16


class InvalidSamplingParams(InvalidRequestError):
    """A sampling parameter is out of range; the message names the field and the allowed range.
    An ``InvalidRequestError``: the request can never run, so it is refused at admission."""


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples and when it stops.

    ``temperature == 0`` is greedy (argmax; top-k/top-p/min-p and seed are then irrelevant).
    ``n`` choices sample independently from one prompt; with a seed, choice i is reproducible
    (choice 0 draws exactly what the same request with ``n = 1`` draws).
    """

    max_tokens: int = 16  # new tokens at most; finish_reason "length" when reached
    min_tokens: int = 0  # EOS and stop_token_ids are masked until this many tokens exist
    temperature: float = 1.0
    top_k: int = 0  # 0 (or -1) disables
    top_p: float = 1.0  # nucleus mass in (0, 1]
    min_p: float = 0.0  # drop tokens below min_p * p(top token)
    seed: int | None = None  # same seed, same tokens, whatever else shares the batch
    ignore_eos: bool = False  # EOS may be produced and does not stop the request
    stop_token_ids: tuple[int, ...] = ()  # extra token ids that stop like EOS
    stop: tuple[str, ...] = ()  # stop strings; finish_reason "stop_string"
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # top-N logprobs per generated token (plus the sampled one)
    skip_special_tokens: bool = True
    n: int = 1  # independent choices from one prompt, each streamed with its index

    def __post_init__(self) -> None:
        self._check(self.max_tokens >= 1, "max_tokens", "must be >= 1")
        self._check(0 <= self.min_tokens <= self.max_tokens, "min_tokens", "0..max_tokens")
        self._check(self.temperature >= 0.0, "temperature", "must be >= 0")
        self._check(self.top_k >= -1, "top_k", "-1, 0 (off) or a positive count")
        self._check(0.0 < self.top_p <= 1.0, "top_p", "(0, 1]")
        self._check(0.0 <= self.min_p <= 1.0, "min_p", "[0, 1]")
        self._check(self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs", "0..20")
        self._check(all(s for s in self.stop), "stop", "stop strings must be non-empty")
        self._check(1 <= self.n <= MAX_N, "n", f"1..{MAX_N}")
        # Lists are accepted for convenience and frozen so params stay hashable and immutable.
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "stop", tuple(self.stop))

    def check_vocab(self, vocab_size: int) -> None:
        """Raise unless every token id the params name is in the model's vocabulary: checked at
        admission (``LLMEngine.add_request``, the job service's intake), because only then is
        the vocabulary known, and a step must never meet an id it cannot index."""
        bad = [t for t in self.stop_token_ids if not 0 <= t < vocab_size]
        self._check(
            not bad, "stop_token_ids", f"each must be in 0..{vocab_size - 1}, got {bad[:5]}"
        )

    @staticmethod
    def _check(ok: bool, name: str, allowed: str) -> None:
        if not ok:
            raise InvalidSamplingParams(f"invalid sampling parameter {name}: {allowed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
