"""The OpenAI-compatible API through the official ``openai`` client, against a live worker."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.gateway.conftest import Served

MODEL = "paternoster"


@pytest.fixture
def client(gateway: Served) -> openai.OpenAI:
    return openai.OpenAI(api_key="unused", base_url=f"{gateway.url}/v1", max_retries=0)


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_completion_streamed_matches_whole(client: openai.OpenAI) -> None:
    kw = {"model": "my-name", "prompt": "The sky is", "max_tokens": 10, "temperature": 0}
    whole = client.completions.create(**kw)  # type: ignore[call-overload]
    assert whole.model == "my-name" and whole.id.startswith("cmpl-")
    assert whole.usage is not None and whole.usage.completion_tokens >= 1
    stream = client.completions.create(**kw, stream=True, stream_options={"include_usage": True})  # type: ignore[call-overload]
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] in ("stop", "length") and not any(reasons[:-1])


def test_completion_token_ids_prompt(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=4)
    assert out.usage is not None and out.usage.prompt_tokens == 3


def test_chat_streamed_matches_whole(client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    kw = {"model": MODEL, "messages": messages, "max_tokens": 10, "temperature": 0}
    whole = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert whole.usage is not None and whole.usage.total_tokens > whole.usage.completion_tokens
    chunks = list(client.chat.completions.create(**kw, stream=True))  # type: ignore[call-overload]
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_n_2(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Tell me a story"}]
    whole = client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=6,
        n=2,
        seed=7,
    )
    assert [c.index for c in whole.choices] == [0, 1]
    stream = client.completions.create(model=MODEL, prompt="A", max_tokens=6, n=2, stream=True)
    by_choice: dict[int, str] = {0: "", 1: ""}
    finished = set()
    for chunk in stream:
        for choice in chunk.choices:
            by_choice[choice.index] += choice.text
            if choice.finish_reason:
                finished.add(choice.index)
    assert finished == {0, 1} and all(by_choice.values())


def test_unsupported_and_invalid_are_422(client: openai.OpenAI) -> None:
    with pytest.raises(openai.UnprocessableEntityError, match="presence_penalty"):
        client.completions.create(model=MODEL, prompt="A", presence_penalty=3.0)
    with pytest.raises(openai.UnprocessableEntityError, match="temperature"):
        client.completions.create(model=MODEL, prompt="A", temperature=-1)
    with pytest.raises(openai.UnprocessableEntityError, match="one prompt"):
        client.completions.create(model=MODEL, prompt=["a", "b"])
    with pytest.raises(openai.UnprocessableEntityError, match="messages"):
        client.chat.completions.create(model=MODEL, messages=[])


def _stream_then_leave(served: Served, headers: dict[str, str]) -> str:
    """Open a streamed chat completion on the idle gateway, read its headers, hang up."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    with (
        httpx.Client(base_url=served.url, timeout=10) as http,
        http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response,
    ):
        assert response.status_code == 200
        return response.headers["X-Paternoster-Job-Id"]


def _state(served: Served, job_id: str) -> str:
    state: str = httpx.get(f"{served.url}/v1/jobs/{job_id}").json()["state"]
    return state


def test_disconnect_cancels_job(idle_gateway: Served) -> None:
    job_id = _stream_then_leave(idle_gateway, {})
    deadline = time.monotonic() + 10
    while _state(idle_gateway, job_id) != "cancelled":
        assert time.monotonic() < deadline, "the job was not cancelled"
        time.sleep(0.05)


def test_disconnect_keeps_job_when_asked(idle_gateway: Served) -> None:
    job_id = _stream_then_leave(idle_gateway, {"X-Paternoster-Keep-On-Disconnect": "1"})
    time.sleep(1.5)  # longer than a disconnect takes to cancel in the test above
    assert _state(idle_gateway, job_id) == "queued"


def test_non_streamed_timeout_is_504_and_cancels(idle_gateway: Served) -> None:
    http = httpx.post(
        f"{idle_gateway.url}/v1/completions", json={"prompt": "A", "max_tokens": 2}, timeout=10
    )
    assert http.status_code == 504
    error = http.json()["error"]
    assert error["code"] == "timeout" and _state(idle_gateway, error["job_id"]) == "cancelled"


def test_job_error_is_400_whole_and_error_chunk_streamed(client: openai.OpenAI) -> None:
    too_long = [5] * 600  # the tiny model's context is 512 tokens: the worker rejects the job
    with pytest.raises(openai.BadRequestError, match="prompt_too_long"):
        client.completions.create(model=MODEL, prompt=too_long, max_tokens=4)
    with pytest.raises(openai.APIError, match="prompt"):
        list(client.completions.create(model=MODEL, prompt=too_long, max_tokens=4, stream=True))
