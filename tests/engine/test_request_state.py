"""`RequestState.take` (the overlapped loop's resolve) decides ends as `emit` does after it, in
the place `reserve` held while the token was in flight."""

from __future__ import annotations

from typing import Any

import pytest

from worker.engine.outputs import RequestOutput
from worker.engine.request_state import RequestState
from worker.engine.sampler import TokenLogprobs
from worker.engine.sampling_params import SamplingParams
from worker.engine.sequence import PLACEHOLDER, FinishReason, Sequence

EOS = 2


class Echo:
    """A detokenizer stand-in: one character per token, no stop strings."""

    stop_string = None

    def add_tokens(self, token_ids: Any) -> str:
        return "x" * len(token_ids)

    def add_token(self, token_id: int) -> str:
        return "x"

    def finish(self) -> str:
        return ""


def state(params: SamplingParams, max_model_len: int = 1000) -> RequestState:
    seq = Sequence("r", [5, 6, 7], params, 0)
    return RequestState(seq, Echo(), frozenset({EOS}), max_model_len)  # type: ignore[arg-type]


CASES = [
    (SamplingParams(max_tokens=4), [9, 9, 9, 9], FinishReason.LENGTH),
    (SamplingParams(max_tokens=9), [9, EOS], FinishReason.STOP),
    (SamplingParams(max_tokens=9, min_tokens=3), [EOS, 9, EOS], FinishReason.STOP),
    (SamplingParams(max_tokens=9, ignore_eos=True), [EOS, EOS, *[9] * 7], FinishReason.LENGTH),
    (SamplingParams(max_tokens=9, stop_token_ids=(11,)), [9, 11], FinishReason.STOP),
]


@pytest.mark.parametrize(("params", "tokens", "reason"), CASES)
def test_take_ends_where_append_ends(
    params: SamplingParams, tokens: list[int], reason: FinishReason
) -> None:
    taking, appending = state(params), state(params)
    for i, token in enumerate(tokens):
        ends = taking.take(token, taking.reserve())
        out, why = appending.append(token, None)
        assert ends is (why is not None)
        assert taking.seq.token_ids == appending.seq.token_ids
        last = i == len(tokens) - 1
        assert ends is last, (i, token)
    assert why == reason
    assert out.finished and out.num_output_tokens == len(tokens)
    n = len(taking.seq.token_ids)
    taking.reserve()  # the next step is in flight when the deferred half runs
    emitted, emitted_why = taking.emit(tokens[-1], None, n)  # on the taken token
    assert emitted_why == reason and emitted == out


def test_take_ends_at_the_models_length() -> None:
    taking = state(SamplingParams(max_tokens=50), max_model_len=5)
    assert [taking.take(9, taking.reserve()), taking.take(9, taking.reserve())] == [False, True]


def test_a_place_is_held_until_the_token_comes_and_dropped_if_it_never_does() -> None:
    taking = state(SamplingParams(max_tokens=3))
    first = taking.reserve()
    assert first == 3 and taking.seq.token_ids == [5, 6, 7, PLACEHOLDER]
    assert taking.seq.num_uncomputed_tokens == 4  # the scheduler sees the token to compute
    second = taking.reserve()  # the next step launched before the first token came back
    assert second == 4 and taking.seq.token_ids[3:] == [PLACEHOLDER, PLACEHOLDER]
    assert taking.take(8, first) is False and taking.seq.token_ids[3:] == [8, PLACEHOLDER]
    # The third token ends it by length whatever it is: no place, so no row for it next step.
    assert taking.reserve() == 5 and len(taking.seq.token_ids) == 5
    taking.seq.drop_placeholders()  # e.g. aborted before the second came back
    assert taking.seq.token_ids == [5, 6, 7, 8]


def test_an_emitted_output_is_the_named_tuples_value_field_by_field() -> None:
    # `emit` builds the output as a plain tuple in the fields' order: every field distinct
    # here, so a field out of place shows.
    seq = Sequence("req-7", [5, 6, 7], SamplingParams(max_tokens=9, logprobs=1), 0, index=3)
    seq.num_cached_tokens = 2
    lps = TokenLogprobs(9, -0.5, 1, ((9, -0.5),))
    got, why = RequestState(seq, Echo(), frozenset({EOS}), 1000).append(9, lps)  # type: ignore[arg-type]
    assert why is None
    assert got == RequestOutput(
        request_id="req-7",
        new_token_ids=(9,),
        text_delta="x",
        finished=False,
        finish_reason=None,
        num_prompt_tokens=3,
        num_output_tokens=1,
        logprobs=(lps,),
        index=3,
        num_cached_tokens=2,
    )
    assert type(got) is RequestOutput and got.error is None and got.error_type is None
    ended, why = RequestState(seq, Echo(), frozenset({EOS}), 1000).emit(EOS, None, 5)  # type: ignore[arg-type]
    assert why is FinishReason.STOP and ended.finished and ended.finish_reason is why
    assert ended.text_delta == "" and ended.logprobs == () and ended.num_output_tokens == 2
