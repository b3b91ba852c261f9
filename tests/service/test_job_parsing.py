"""parse_job, the intake's one door: every payload that could make a step raise is refused here,
with the field named, and a prompt too large to fit is refused before it is tokenized."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from producer import InvalidJob, Producer
from producer.protocol import MAX_PAYLOAD_BYTES, ErrorCode
from worker.service.job_parsing import PromptLimits, Rejected, parse_job


class CountingTokenizer:
    """Byte-level ids; counts its calls so a test can prove it was never asked."""

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, text: str) -> list[int]:
        self.calls += 1
        return list(text.encode())

    def get_vocab(self) -> dict[str, int]:
        return {"Ġthe": 0, "Ġand": 1, "x": 2}  # longest entry: 5 UTF-8 bytes


@pytest.fixture
def limits() -> PromptLimits:
    return PromptLimits(CountingTokenizer(), max_model_len=96, vocab_size=256)


def rejected(payload: str, limits: PromptLimits, job_id: str = "j1") -> Rejected:
    with pytest.raises(Rejected) as info:
        parse_job(job_id, payload, limits)
    return info.value


def test_a_good_payload_gives_spec_ids_and_params(limits: PromptLimits) -> None:
    spec, ids, params = parse_job(
        "j1", '{"id": "j1", "prompt": "hi", "sampling": {"max_tokens": 3}}', limits
    )
    assert spec.id == "j1" and ids == [104, 105] and params.max_tokens == 3


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        ('{"max_tokens": true}', "max_tokens"),
        ('{"max_tokens": "2"}', "max_tokens"),
        ('{"temperature": Infinity}', "Infinity"),
        ('{"temperature": 1e999}', "temperature"),
        ('{"top_p": NaN}', "NaN"),
        ('{"ignore_eos": "yes"}', "ignore_eos"),
        ('{"stop_token_ids": [true]}', "stop_token_ids"),
        ('{"stop_token_ids": [-1]}', "stop_token_ids"),
        ('{"stop_token_ids": [99999999]}', "stop_token_ids"),
        ('{"seed": 1.5}', "seed"),
    ],
)
def test_loose_or_impossible_sampling_values_are_refused(
    limits: PromptLimits, sampling: str, field: str
) -> None:
    exc = rejected(f'{{"id": "j1", "prompt": "hi", "sampling": {sampling}}}', limits)
    assert field in exc.message
    assert exc.code in (ErrorCode.INVALID_REQUEST, ErrorCode.MALFORMED_JSON)


def test_a_nan_deadline_is_refused(limits: PromptLimits) -> None:
    exc = rejected('{"id": "j1", "prompt": "hi", "deadline": NaN}', limits)
    assert exc.code is ErrorCode.MALFORMED_JSON and "NaN" in exc.message


def test_max_tokens_past_the_context_is_refused_with_what_fits(limits: PromptLimits) -> None:
    exc = rejected('{"id": "j1", "prompt": "0123456789", "sampling": {"max_tokens": 87}}', limits)
    assert exc.code is ErrorCode.INVALID_REQUEST
    assert "max_tokens" in exc.message and "at most 86 fit" in exc.message
    parse_job("j1", '{"id": "j1", "prompt": "0123456789", "sampling": {"max_tokens": 86}}', limits)


def test_a_payload_without_an_id_says_so(limits: PromptLimits) -> None:
    exc = rejected('{"prompt": "hi"}', limits, job_id="order-7")
    assert "no id" in exc.message and "order-7" in exc.message and "!=" not in exc.message


def test_a_payload_over_the_limit_is_refused_before_it_is_parsed(limits: PromptLimits) -> None:
    huge = json.dumps({"id": "j1", "prompt": "a" * MAX_PAYLOAD_BYTES})
    started = time.perf_counter()
    exc = rejected(huge, limits)
    assert exc.code is ErrorCode.INVALID_REQUEST and str(MAX_PAYLOAD_BYTES) in exc.message
    assert limits.tokenizer.calls == 0
    assert time.perf_counter() - started < 5  # generous: the point is no tokenizing


@pytest.mark.parametrize("as_messages", [False, True])
def test_a_prompt_whose_bytes_prove_it_too_long_is_never_tokenized(
    limits: PromptLimits, as_messages: bool
) -> None:
    text = "y" * (limits.max_prompt_bytes + 1)  # 4 x 5 bytes x 96 tokens, plus one
    body: dict[str, Any] = {"id": "j1"}
    if as_messages:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    exc = rejected(json.dumps(body), limits)
    assert exc.code is ErrorCode.PROMPT_TOO_LONG and limits.tokenizer.calls == 0


def test_invalid_utf8_decoded_with_surrogateescape_is_malformed(limits: PromptLimits) -> None:
    payload = b'{"id":"j1","prompt":"\xff"}'.decode("utf-8", "surrogateescape")
    exc = rejected(payload, limits)
    assert exc.code is ErrorCode.MALFORMED_JSON and "UTF-8" in exc.message


def test_producers_refuse_a_payload_no_worker_would_take(redis_url: str, prefix: str) -> None:
    with Producer(redis_url, prefix=prefix) as p, pytest.raises(InvalidJob, match="limit"):
        p.submit("a" * MAX_PAYLOAD_BYTES)
    assert not p.redis.exists(p.keys.jobs)
