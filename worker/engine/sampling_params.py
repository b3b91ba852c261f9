"""Per-request sampling parameters, with vLLM's meanings so users need not relearn them.

The wire's ``SamplingSpec`` (``producer.protocol``) is the one declaration of their names,
defaults and ranges: the fields here take its defaults, and every ``SamplingParams`` is checked
by the spec's own validation, so a range is written once. A job's params are built from its
spec by ``SamplingParams.from_spec``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from annotated_types import Ge, Gt, Le
from pydantic import ValidationError

from producer.constraints import Structure
from producer.protocol import SamplingSpec
from worker.engine.prompt import InvalidRequestError

_SPEC_FIELDS = SamplingSpec.model_fields


class InvalidSamplingParams(InvalidRequestError):
    """A sampling parameter is out of range; the message names the field and the allowed range.
    An ``InvalidRequestError``: the request can never run, so it is refused at admission."""


def _default(name: str) -> Any:
    return _SPEC_FIELDS[name].default


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples and when it stops.

    ``temperature == 0`` is greedy (argmax; top-k/top-p/min-p and seed are then irrelevant).
    ``n`` choices sample independently from one prompt; with a seed, choice i is reproducible
    (choice 0 draws exactly what the same request with ``n = 1`` draws).
    """

    max_tokens: int = _default("max_tokens")  # new tokens at most; then finish_reason "length"
    min_tokens: int = _default("min_tokens")  # EOS and stop_token_ids are masked until then
    temperature: float = _default("temperature")
    top_k: int = _default("top_k")  # 0 (or -1) disables
    top_p: float = _default("top_p")  # nucleus mass in (0, 1]
    min_p: float = _default("min_p")  # drop tokens below min_p * p(top token)
    seed: int | None = _default("seed")  # same seed, same tokens, whatever shares the batch
    ignore_eos: bool = _default("ignore_eos")  # EOS may be produced and does not stop it
    stop_token_ids: tuple[int, ...] = _default("stop_token_ids")  # stop like EOS
    stop: tuple[str, ...] = _default("stop")  # stop strings; finish_reason "stop_string"
    include_stop_str_in_output: bool = _default("include_stop_str_in_output")
    logprobs: int | None = _default("logprobs")  # top-N logprobs per token (plus the sampled)
    skip_special_tokens: bool = _default("skip_special_tokens")
    n: int = _default("n")  # independent choices from one prompt, each streamed with its index
    presence_penalty: float = _default("presence_penalty")  # - p if it is in the output
    frequency_penalty: float = _default("frequency_penalty")  # - f x its count in the output
    repetition_penalty: float = _default("repetition_penalty")  # prompt + output, vLLM's rule
    logit_bias: Mapping[int, float] | None = _default("logit_bias")  # token id -> added logit
    # A constraint the output must match; None (a call only RUF009 cannot see is immutable).
    structure: Structure | None = _default("structure")  # noqa: RUF009

    def __post_init__(self) -> None:
        # Lists are accepted for convenience and frozen so params stay hashable and immutable.
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "stop", tuple(self.stop))
        try:
            spec = SamplingSpec.model_validate(self.__dict__)
        except ValidationError as exc:
            raise InvalidSamplingParams(_describe(exc)) from None
        # The spec's parsed forms: a constraint given as a dict becomes its model, bias keys ints.
        object.__setattr__(self, "structure", spec.structure)
        object.__setattr__(self, "logit_bias", spec.logit_bias)

    @classmethod
    def from_spec(cls, spec: SamplingSpec) -> SamplingParams:
        """A job's params: its spec's fields, one for one (``test_sampling_contract``)."""
        return cls(**{name: getattr(spec, name) for name in _SPEC_FIELDS})

    @property
    def penalized(self) -> bool:
        """Whether a penalty or a bias changes this request's logits."""
        no_penalty = self.presence_penalty == self.frequency_penalty == 0.0
        return bool(self.logit_bias) or not no_penalty or self.repetition_penalty != 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _describe(exc: ValidationError) -> str:
    """The first error as ``invalid sampling parameter <name>: <allowed>``, the range read from
    the spec's declaration (``n: 1..16``, ``top_p: (0.0, 1.0]``)."""
    error = exc.errors()[0]
    name = str(error["loc"][0]) if error["loc"] else ""
    message = str(error["msg"]).removeprefix("Value error, ")
    if name not in _SPEC_FIELDS:  # the spec's cross-field rule: its message names the field
        name, _, allowed = message.partition(" ")
        return f"invalid sampling parameter {name}: {allowed}"
    return f"invalid sampling parameter {name}: {allowed_range(name) or message}"


def allowed_range(name: str) -> str:
    """The range ``SamplingSpec`` declares for ``name``: ``1..16``, ``(0.0, 1.0]``, ``>= 0``;
    empty when it declares none."""
    bounds: dict[str, Any] = {}
    for m in _SPEC_FIELDS[name].metadata:
        if isinstance(m, Ge | Gt | Le):
            bounds.update(dataclasses.asdict(m))
    low = bounds.get("ge", bounds.get("gt"))
    if "le" not in bounds:
        return "" if low is None else (f">= {low}" if "ge" in bounds else f"> {low}")
    if isinstance(low, int) and "ge" in bounds:
        return f"{low}..{bounds['le']}"
    return f"{'[' if 'ge' in bounds else '('}{low}, {bounds['le']}]"
