"""One request into the engine, and the checks it must pass before it may run.

``EngineRequest`` is what ``LLMEngine.add_request`` takes and the job service's ``AdmittedJob``
holds: the prompt's token ids, how to sample, and how the scheduler and prefix cache treat it.
``validate_request`` is every check of a request, run once at admission: by the engine, and by
the job service's intake before it marks a job started (with its own tokenizer, on its thread).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from producer.protocol import DEFAULT_PRIORITY
from worker.engine.grammar import check_structure
from worker.engine.prompt import check_prompt
from worker.engine.sampler import choice_seed
from worker.engine.sampling_params import InvalidSamplingParams, SamplingParams


@dataclass(frozen=True)
class EngineRequest:
    """``priority``: lower is more urgent (admitted first, may preempt less urgent requests).
    Within a priority, ``tenant``s share the batch by fair share. Only requests with the same
    ``cache_salt`` (e.g. a tenant id) share cached prefix blocks. ``resume[i]``: the output
    tokens choice ``i`` produced in an earlier run (a worker that died); it continues after
    them, its text and seeded sampling as if it had never stopped. ``arrival_time``: when it
    was submitted, on the engine's clock (``time.monotonic``, the scheduler's): aging counts
    from then (``aging.py``), so its wait in Redis, in the worker's inbox and while its
    constraint compiles all age it; None: when ``LLMEngine.add_request`` first takes it."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    priority: int = DEFAULT_PRIORITY
    tenant: str = "default"
    cache_salt: str | None = None
    resume: tuple[tuple[int, ...], ...] = ()
    arrival_time: float | None = None

    def __post_init__(self) -> None:
        # Any sequence of ints is taken (a list, a tokenizer's ids) and frozen as a tuple.
        object.__setattr__(self, "prompt_token_ids", tuple(int(t) for t in self.prompt_token_ids))
        object.__setattr__(self, "resume", tuple(tuple(r) for r in self.resume))

    def choice_params(self, index: int) -> SamplingParams:
        """Choice ``index``'s params: its own seed, so seeded choices differ yet reproduce."""
        params = self.params
        if params.seed is None or index == 0:
            return params
        return dataclasses.replace(params, seed=choice_seed(params.seed, index))


def validate_request(
    prompt_token_ids: Sequence[int],
    params: SamplingParams,
    max_model_len: int,
    vocab_size: int,
    *,
    refuse_past_context: bool = False,
) -> None:
    """Raise ``InvalidRequestError`` (or its ``InvalidSamplingParams``, ``PromptTooLongError``)
    unless the request can run: stop and logit_bias ids in the vocabulary, a structure that
    parses, a non-empty prompt in it that leaves room for a token. With
    ``refuse_past_context`` (the job service, as OpenAI and vLLM's server do), ``max_tokens``
    must fit after the prompt too; else generation stops at the context (finish reason
    ``length``). Nothing that passes can make a step raise."""
    for name, ids in (("stop_token_ids", params.stop_token_ids), ("logit_bias", params.logit_bias)):
        bad = [t for t in ids or () if not 0 <= t < vocab_size]
        if bad:
            raise InvalidSamplingParams(
                f"invalid sampling parameter {name}: each token id must be in "
                f"0..{vocab_size - 1}, got {bad[:5]}"
            )
    if params.structure is not None:  # parsed here; compiled later, off the model loop
        check_structure(params.structure)
    check_prompt(prompt_token_ids, max_model_len, vocab_size)
    room = max_model_len - len(prompt_token_ids)
    if refuse_past_context and params.max_tokens > room:
        raise InvalidSamplingParams(
            f"invalid sampling parameter max_tokens: {params.max_tokens} new tokens do not fit "
            f"after the prompt's {len(prompt_token_ids)} in this model's context of "
            f"{max_model_len} tokens; at most {room} fit"
        )
