"""A step's flags skip only the sampler passes no row needs: the same tokens and logprobs as a
plain list of requests, which takes every pass."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from worker.engine import step_launch
from worker.engine.detokenizer import IncrementalDetokenizer
from worker.engine.request_state import RequestState, sampling_rows
from worker.engine.sampler import Sampler
from worker.engine.sampling_params import SamplingParams
from worker.engine.sampling_rows import (
    ALL,
    LOGPROBS,
    MIN_TOKENS,
    PROCESSED,
    RANDOM,
    RowsBySeq,
    SamplingRequest,
    SamplingRows,
    UnreadRows,
    flags_of,
    row_flags,
)
from worker.engine.sequence import Sequence

EOS = 2
V = 613


@pytest.mark.parametrize(
    ("fields", "flags"),
    [
        ({}, 0),
        ({"temperature": 0.8, "seed": 3}, RANDOM),
        ({"temperature": 1e-6}, 0),  # below the greedy threshold: argmax
        ({"min_tokens": 2}, MIN_TOKENS),
        ({"stop_token_ids": [7]}, MIN_TOKENS),  # its range check runs in that pass
        ({"logprobs": 0}, LOGPROBS),
        ({"presence_penalty": 0.5}, PROCESSED),
        ({"logit_bias": {5: 2.0}}, PROCESSED),
        ({"temperature": 0.7, "logprobs": 2, "min_tokens": 1}, RANDOM | LOGPROBS | MIN_TOKENS),
    ],
)
def test_row_flags_name_the_passes_a_row_needs(fields: dict[str, Any], flags: int) -> None:
    assert row_flags(SamplingParams(**{"temperature": 0.0, **fields})) == flags


def rows(params: list[SamplingParams], output_index: int) -> SamplingRows:
    out = SamplingRows()
    for i, p in enumerate(params):
        seq = Sequence(f"r{i}", [1, 3, 4], p, i)
        seq.token_ids += [5 + i] * output_index  # the tokens it generated so far
        out.append(SamplingRequest(p, output_index, seq))
    for p in params:
        out.flags |= row_flags(p)
    return out


def greedy(**fields: Any) -> SamplingParams:
    return SamplingParams(temperature=0.0, **fields)


MIXES = {
    "greedy": [greedy()] * 5,
    "greedy, min_tokens": [greedy(), greedy(min_tokens=4)] * 3,
    "seeded": [SamplingParams(temperature=0.9, top_p=0.8, seed=s) for s in range(4)],
    "mixed": [
        greedy(),
        SamplingParams(temperature=0.7, top_k=20, seed=1, logprobs=3),
        greedy(frequency_penalty=0.5, logit_bias={EOS: 9.0}),
        greedy(min_tokens=3, stop_token_ids=[11], logprobs=0),
    ],
}


@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("output_index", [0, 5])
def test_flagged_rows_sample_as_the_full_path(mix: str, output_index: int) -> None:
    params = MIXES[mix]
    logits = torch.randn(len(params), V, generator=torch.Generator().manual_seed(7)) * 4
    logits[:, EOS] += 20.0  # EOS wins where it is not masked: min_tokens must show
    logits[:, 11] += 10.0
    flagged = rows(params, output_index)
    assert flags_of(flagged) == flagged.flags
    fast = Sampler([EOS], seed=0)(logits.clone(), flagged)
    full = Sampler([EOS], seed=0)(logits.clone(), list(flagged))
    assert fast.token_ids == full.token_ids
    assert fast.logprobs == full.logprobs
    if mix == "greedy, min_tokens" and output_index == 0:
        assert all(t != EOS for t in fast.token_ids[1::2]) and fast.token_ids[0] == EOS


def test_a_plain_list_takes_every_pass() -> None:
    assert flags_of([SamplingRequest(SamplingParams(), 0)]) == ALL
    assert flags_of(SamplingRows()) == 0
    assert flags_of(rows(MIXES["mixed"], 0)) == ALL


def states(params: list[SamplingParams], output_index: int) -> list[RequestState]:
    out = []
    for i, p in enumerate(params):
        seq = Sequence(f"r{i}", [1, 3, 4], p, i)
        seq.token_ids += [5 + i] * output_index
        detokenizer = IncrementalDetokenizer(FakeTokenizer(), seq.token_ids, p)
        out.append(RequestState(seq, detokenizer, frozenset([EOS]), 4096))
    return out


class FakeTokenizer:
    def decode(self, token_ids: list[int], skip_special_tokens: bool = True, **_: Any) -> str:
        return "".join(f"<{t}>" for t in token_ids)


def test_rows_without_flags_are_built_only_when_read_and_sample_the_same() -> None:
    taken = states(MIXES["greedy"], 3)
    unread = sampling_rows(taken)
    assert isinstance(unread, UnreadRows) and flags_of(unread) == 0 and len(unread) == 5
    assert unread._rows is None  # nothing built for the sampler's greedy pass
    logits = torch.randn(5, V, generator=torch.Generator().manual_seed(3))
    fast = Sampler([EOS], seed=0)(logits.clone(), unread)
    assert unread._rows is None
    built = list(unread)  # read: built then, as the flagged path builds them
    assert built == [SamplingRequest(s.params, 3, s.seq) for s in taken]
    assert unread[1] is built[1] and unread[1:3] == built[1:3]
    full = Sampler([EOS], seed=0)(logits.clone(), built)
    assert fast.token_ids == full.token_ids == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize("mix", ["greedy, min_tokens", "seeded", "mixed"])
def test_rows_with_a_flag_are_built_at_once(mix: str) -> None:
    taken = states(MIXES[mix], 2)
    flagged = sampling_rows(taken)
    assert isinstance(flagged, SamplingRows)
    assert flagged.flags == rows(MIXES[mix], 2).flags != 0
    assert list(flagged) == [SamplingRequest(s.params, 2, s.seq) for s in taken]


def test_rows_by_sequence_are_zipped_when_first_read_and_a_launch_reads_none_unflagged() -> None:
    taken = states(MIXES["greedy"], 1)
    unread = sampling_rows(taken)
    seq_ids = [s.seq.seq_id for s in taken]
    by_seq = RowsBySeq(seq_ids, unread)
    assert len(by_seq) == 5 and by_seq._by_seq is None and unread._rows is None
    # The launcher's rows for the runner's order (a failed sequence drops its row).
    kept = tuple(seq_ids[1:])
    launched = step_launch._rows(by_seq, kept, 0)
    assert isinstance(launched, UnreadRows) and len(launched) == 4 and by_seq._by_seq is None
    assert [r.seq for r in launched] == [s.seq for s in taken[1:]]  # read: built then
    assert dict(by_seq) == {s.seq.seq_id: r for s, r in zip(taken, unread, strict=True)}
    flagged = step_launch._rows(by_seq, kept, MIN_TOKENS)
    assert isinstance(flagged, SamplingRows) and flagged.flags == MIN_TOKENS
    assert list(flagged) == list(launched)
