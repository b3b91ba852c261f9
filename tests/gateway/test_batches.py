"""The Batch API end to end: the official ``openai`` client, the gateway's runner, a worker.

The idle gateway (no worker on its prefix) shows what needs no model: a cancel, the end of a
completion window, a runner that stops and another that resumes, tenants kept apart.
"""

from __future__ import annotations

import io
import json
import time

import openai
import pytest

from tests.gateway.conftest import Served

MODEL = "paternoster"


def _client(served: Served, token: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(api_key=token, base_url=f"{served.url}/v1", max_retries=0)


def jsonl(rows: list[dict[str, object]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def completion_line(custom_id: str, prompt: object, **body: object) -> dict[str, object]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 6, "temperature": 0, **body}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body}


def wait_status(client: openai.OpenAI, batch_id: str, wanted: set[str], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while (status := client.batches.retrieve(batch_id).status) not in wanted:
        assert time.monotonic() < deadline, f"batch stayed {status}"
        time.sleep(0.1)
    return status


def file_lines(client: openai.OpenAI, file_id: str | None) -> dict[str, dict[str, object]]:
    assert file_id is not None
    rows = [json.loads(r) for r in client.files.content(file_id).text.splitlines()]
    by_id = {r["custom_id"]: r for r in rows}
    assert len(by_id) == len(rows), "a custom_id twice"
    return by_id


def start_batch(client: openai.OpenAI, rows: list[dict[str, object]], endpoint: str) -> str:
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(rows))), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(jsonl(rows))
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
        metadata={"run": "test"},
    )
    assert batch.status == "validating" and batch.metadata == {"run": "test"}
    assert batch.expires_at == batch.created_at + 24 * 3600
    return batch.id


@pytest.mark.slow
def test_batch_matches_one_by_one(gateway: Served) -> None:
    client = _client(gateway)
    rows = [completion_line(f"req-{i}", f"Count {i}:") for i in range(18)]
    rows.insert(3, completion_line("bad-temp", "A", temperature=-1))
    rows.insert(9, completion_line("two-prompts", ["a", "b"]))
    batch_id = start_batch(client, rows, "/v1/completions")
    assert wait_status(client, batch_id, {"completed", "failed"}, 120) == "completed"
    batch = client.batches.retrieve(batch_id)
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed) == (20, 18)
    assert batch.request_counts.failed == 2 and batch.completed_at is not None
    output = file_lines(client, batch.output_file_id)
    errors = file_lines(client, batch.error_file_id)
    assert sorted(errors) == ["bad-temp", "two-prompts"]
    assert errors["bad-temp"]["response"]["status_code"] == 422  # type: ignore[index]
    assert "one prompt" in json.dumps(errors["two-prompts"])  # the route's own refusal
    assert set(output) == {f"req-{i}" for i in range(18)}
    for i in (0, 7, 17):  # the same requests one by one: the same greedy text
        one = client.completions.create(model=MODEL, prompt=f"Count {i}:", max_tokens=6,
                                        temperature=0)  # fmt: skip
        response = output[f"req-{i}"]["response"]
        assert response["status_code"] == 200  # type: ignore[index]
        body = response["body"]  # type: ignore[index]
        assert body["choices"][0]["text"] == one.choices[0].text
        assert body["object"] == "text_completion"
    assert client.files.retrieve(batch.output_file_id).purpose == "batch_output"  # type: ignore[arg-type]
    assert batch_id in [b.id for b in client.batches.list(limit=100)]


def test_tenants_see_only_their_own(idle_auth_gateway: Served) -> None:
    a, b = _client(idle_auth_gateway, "tok-a"), _client(idle_auth_gateway, "tok-b")
    batch_id = start_batch(a, [completion_line("x", "A")], "/v1/completions")
    input_id = a.batches.retrieve(batch_id).input_file_id
    for call in (lambda: b.files.retrieve(input_id), lambda: b.files.content(input_id),
                 lambda: b.batches.retrieve(batch_id), lambda: b.batches.cancel(batch_id),
                 lambda: b.batches.create(input_file_id=input_id, endpoint="/v1/completions",
                                          completion_window="24h")):  # fmt: skip
        with pytest.raises(openai.NotFoundError):
            call()
    assert batch_id in [x.id for x in a.batches.list()]
    assert batch_id not in [x.id for x in b.batches.list()]
    assert input_id in [f.id for f in a.files.list()] and not list(b.files.list())
    with pytest.raises(openai.ConflictError, match="input of batch"):
        a.files.delete(input_id)  # the batch's runner reads it again after a takeover
    assert a.batches.cancel(batch_id).status in ("cancelling", "cancelled")
    assert wait_status(a, batch_id, {"cancelled"}, 20) == "cancelled"
    with pytest.raises(openai.NotFoundError):
        b.files.delete(input_id)
    assert a.files.delete(input_id).deleted
    with pytest.raises(openai.NotFoundError):
        a.files.retrieve(input_id)


def test_refused_requests(idle_gateway: Served) -> None:
    client = _client(idle_gateway)
    with pytest.raises(openai.UnprocessableEntityError, match="purpose"):
        client.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune")
    with pytest.raises(openai.UnprocessableEntityError, match="UTF-8"):
        client.files.create(file=("x.jsonl", io.BytesIO(b"\xff\xfe\n")), purpose="batch")
    uploaded = client.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="batch")
    for endpoint, window, needle in (("/v1/embeddings", "24h", "endpoint"),
                                     ("/v1/completions", "1h", "completion_window")):  # fmt: skip
        with pytest.raises(openai.UnprocessableEntityError, match=needle):
            client.batches.create(input_file_id=uploaded.id, endpoint=endpoint,  # type: ignore[arg-type]
                                  completion_window=window)  # type: ignore[arg-type]  # fmt: skip
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
    failed = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions",
                                   completion_window="24h")  # fmt: skip
    assert wait_status(client, failed.id, {"failed"}, 20) == "failed"
    errors = client.batches.retrieve(failed.id).errors
    assert errors is not None and errors.data and errors.data[0].code == "invalid_json_line"
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(failed.id)
