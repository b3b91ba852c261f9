"""`RequestState.take` (the overlapped loop's resolve) decides ends as `emit` does after it."""

from __future__ import annotations

from typing import Any

import pytest

from worker.engine.request_state import RequestState
from worker.engine.sampling_params import SamplingParams
from worker.engine.sequence import FinishReason, Sequence

EOS = 2


class Echo:
    """A detokenizer stand-in: one character per token, no stop strings."""

    stop_string = None

    def add_tokens(self, token_ids: Any) -> str:
        return "x" * len(token_ids)

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
        ends = taking.take(token)
        out, why = appending.append(token, None)
        assert ends is (why is not None)
        assert taking.seq.token_ids == appending.seq.token_ids
        last = i == len(tokens) - 1
        assert ends is last, (i, token)
    assert why == reason
    assert out.finished and out.num_output_tokens == len(tokens)
    emitted, emitted_why = taking.emit(tokens[-1], None)  # the deferred half, on the taken token
    assert emitted_why == reason and emitted == out


def test_take_ends_at_the_models_length() -> None:
    taking = state(SamplingParams(max_tokens=50), max_model_len=5)
    assert [taking.take(9), taking.take(9)] == [False, True]  # 3 prompt + 2 = 5
