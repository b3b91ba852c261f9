"""A step's sampling rows: one `SamplingRequest` per row, and what the rows need, as flags.

Each choice's flags are worked out once from its params (`row_flags`, kept on its
`RequestState` from admission to its end), and a step's `SamplingRows` carries the OR of its
rows' flags. The sampler skips each per-row pass no row of the step needs: at batch 256 all
greedy, the min-tokens scan, the constraint/penalty scan, the greedy test and the logprobs scan
were five Python loops over 256 rows a step. A plain list of requests has every flag: it takes
every pass, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from collections.abc import Sequence as Rows
from typing import NamedTuple, overload

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


class UnreadRows(Rows[SamplingRequest]):
    """A step's requests when their flags are 0 (all greedy, nothing masked, no logprobs): no
    sampler pass reads a row then, only their number, so they are built only if one is read (a
    row sampled again alone after its step's sampling failed). Built every step, the 256 rows
    of a decode step cost 0.046 ms, against 0.007 for the flags' test (thread CPU time, Zen 4;
    BENCHMARKS.md "thirteenth pass"). Read late, a row's ``output_index`` may count tokens
    added since the step began: with flags 0 no pass reads it (only seeded random rows do)."""

    flags = 0

    def __init__(self, num_rows: int, build: Callable[[], list[SamplingRequest]]) -> None:
        self._num_rows = num_rows
        self._build = build
        self._rows: list[SamplingRequest] | None = None

    def __len__(self) -> int:
        return self._num_rows

    @overload
    def __getitem__(self, index: int) -> SamplingRequest: ...

    @overload
    def __getitem__(self, index: slice) -> list[SamplingRequest]: ...

    def __getitem__(self, index: int | slice) -> SamplingRequest | list[SamplingRequest]:
        return self._read()[index]

    def __iter__(self) -> Iterator[SamplingRequest]:
        return iter(self._read())

    def _read(self) -> list[SamplingRequest]:
        if self._rows is None:
            self._rows = self._build()
        return self._rows


class RowsBySeq(Mapping[int, SamplingRequest]):
    """A step's rows by sequence id, ``dict(zip(seq_ids, rows))`` made when first read: the
    overlapped loop's launch hands these to its step, whose sampler reads none of `UnreadRows`.
    The rows themselves are taken when the step is launched (`SamplingRows` are built then)."""

    def __init__(self, seq_ids: list[int], rows: Rows[SamplingRequest]) -> None:
        self._seq_ids = seq_ids
        self._rows = rows
        self._by_seq: dict[int, SamplingRequest] | None = None

    def __getitem__(self, seq_id: int) -> SamplingRequest:
        return self._read()[seq_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._seq_ids)

    def _read(self) -> dict[int, SamplingRequest]:
        if self._by_seq is None:
            self._by_seq = dict(zip(self._seq_ids, self._rows, strict=True))
        return self._by_seq


def flags_of(requests: object) -> int:
    """The flags of ``requests``: its own for `SamplingRows` and `UnreadRows`, else all (every
    pass runs)."""
    return requests.flags if isinstance(requests, (SamplingRows, UnreadRows)) else ALL
