"""A step's sampling rows: one `SamplingRequest` per row, and what the rows need, as flags.

Each choice's flags are worked out once from its params (`row_flags`, kept on its
`RequestState` from admission to its end), and a step's `SamplingRows` carries the OR of its
rows' flags. The sampler skips each per-row pass no row of the step needs: at batch 256 all
greedy, the min-tokens scan, the constraint/penalty scan, the greedy test and the logprobs scan
were five Python loops over 256 rows a step. A plain list of requests has every flag: it takes
every pass, as before.
"""

from __future__ import annotations

from typing import NamedTuple

from worker.engine.sampling_params import SamplingParams
from worker.engine.sequence import Sequence as Seq

# Temperatures below this are greedy, as in vLLM: dividing logits by ~1e-6 overflows nothing in
# float32 but makes the softmax a one-hot anyway, and argmax is cheaper.
GREEDY_TEMPERATURE = 1e-5

RANDOM = 1  # samples (temperature at or above GREEDY_TEMPERATURE)
PROCESSED = 2  # a structure constraint, a penalty or a bias (`logits_rows`)
MIN_TOKENS = 4  # min_tokens or stop ids: EOS/stop masking, and the stop ids' range check
LOGPROBS = 8  # logprobs asked
ALL = RANDOM | PROCESSED | MIN_TOKENS | LOGPROBS


class SamplingRequest(NamedTuple):
    """One row of the logits batch (a named tuple: 0.2 us to build against ~1 us for a frozen
    dataclass, once per row per step)."""

    params: SamplingParams
    output_index: int  # tokens this request has generated so far (the one sampled now is this +1)
    # Its sequence: a constraint's matcher and the penalties' counts follow its tokens.
    seq: Seq | None = None


def row_flags(params: SamplingParams) -> int:
    """The passes of the sampler a row under ``params`` needs."""
    flags = RANDOM if params.temperature >= GREEDY_TEMPERATURE else 0
    if params.structure is not None or params.penalized:
        flags |= PROCESSED
    if params.min_tokens or params.stop_token_ids:
        flags |= MIN_TOKENS
    if params.logprobs is not None:
        flags |= LOGPROBS
    return flags


class SamplingRows(list[SamplingRequest]):
    """A step's requests in row order; ``flags``: the OR of the rows' `row_flags`."""

    flags: int = 0


def flags_of(requests: object) -> int:
    """The flags of ``requests``: its own for `SamplingRows`, else all (every pass runs)."""
    return requests.flags if isinstance(requests, SamplingRows) else ALL
