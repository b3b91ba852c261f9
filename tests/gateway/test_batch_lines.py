"""The Batch API's pieces without a server: the JSONL parser, multipart bodies, statuses."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from gateway.batch_lines import BatchLine, LineJob, not_run_line, parse_input, refused_line
from gateway.batch_store import FINAL, NEXT, BatchStatus, batch_body, may_move, time_field
from gateway.errors import ApiError
from gateway.files_upload import parse_multipart

CHAT = "/v1/chat/completions"
DEADLINE = time.time() + 3600


def chat_row(custom_id: object, **over: object) -> dict[str, object]:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
    row = {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}
    return {**row, **over}


def parse(
    rows: list[object], owner: str | None = None
) -> tuple[list[BatchLine], list[dict[str, Any]]]:
    content = b"\n".join(r if isinstance(r, bytes) else json.dumps(r).encode() for r in rows)
    job = LineJob(CHAT, owner, DEADLINE, default_max_tokens=256)
    parsed = parse_input(content, job, lambda i: f"b-{i}")
    return parsed.lines, parsed.problems


def test_valid_lines_become_batch_band_jobs_with_the_window_as_deadline() -> None:
    lines, problems = parse([chat_row("a"), chat_row("b", body={"messages": [
        {"role": "user", "content": "x"}], "user": "u7"})], owner=None)  # fmt: skip
    assert problems == [] and [line.custom_id for line in lines] == ["a", "b"]
    spec = lines[0].spec
    assert spec is not None and spec.id == "b-0" and spec.priority == 10  # the batch band
    assert spec.deadline == DEADLINE and spec.sampling.max_tokens == 5
    assert spec.messages is not None and spec.messages[0].content == "Hi"
    assert lines[1].spec is not None and lines[1].spec.tenant == "u7"  # no auth: `user` names it
    assert lines[1].spec.sampling.max_tokens == 256  # the gateway's default, as the route's
    assert lines[0].model == "m"


def test_owner_wins_over_user_behind_auth() -> None:
    lines, _ = parse([chat_row("a", body={"messages": [{"role": "user", "content": "x"}],
                                          "user": "mallory"})], owner="tenant-a")  # fmt: skip
    assert lines[0].spec is not None and lines[0].spec.tenant == "tenant-a"


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"method": "GET"}, "method"),
        ({"url": "/v1/completions"}, "url"),
        ({"body": {"messages": []}}, "messages"),
        ({"body": {"messages": [{"role": "user", "content": "x"}], "temperature": -1}}, "temp"),
        ({"body": {"messages": [{"role": "user", "content": "x"}], "stream": True}}, "stream"),
        ({"body": {"messages": [{"role": "user", "content": "x"}], "n": 99}}, "n"),
        # refused by the job's own validation (build_spec), not the request model's
        ({"body": {"messages": [{"role": "user", "content": "x"}], "stop": [""]}}, "stop"),
    ],
)
def test_a_refused_line_is_an_error_line_and_the_rest_go_on(
    over: dict[str, object], needle: str
) -> None:
    lines, problems = parse([chat_row("ok"), chat_row("bad", **over)])
    assert problems == [] and lines[0].spec is not None
    bad = lines[1]
    assert bad.spec is None and bad.error is not None and bad.error.status in (400, 422)
    record = json.loads(refused_line(bad, None))
    assert record["custom_id"] == "bad" and record["error"] is None
    assert record["response"]["status_code"] == bad.error.status
    assert needle in record["response"]["body"]["error"]["message"]


def test_file_level_problems_fail_the_batch() -> None:
    _, problems = parse([chat_row("a"), b"{not json", chat_row(7), chat_row("a")])
    assert [(p["code"], p["line"]) for p in problems] == [
        ("invalid_json_line", 2), ("invalid_json_line", 3), ("duplicate_custom_id", 4)
    ]  # fmt: skip
    _, problems = parse([b"", b"  "])
    assert [p["code"] for p in problems] == ["invalid_file"]


def test_not_run_lines_say_why() -> None:
    lines, _ = parse([chat_row("a")])
    record = json.loads(not_run_line(lines[0], "batch_expired"))
    assert record["response"] is None and record["error"]["code"] == "batch_expired"


def test_multipart_as_the_openai_client_sends_it() -> None:
    boundary = "b0undary"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        f"Content-Type: application/octet-stream\r\n\r\n"
        f'{{"a": "--{boundary} inside a line"}}\r\n{{"b": 2}}\n\r\n'
        f"--{boundary}--\r\n"
    ).encode()
    upload = parse_multipart(f"multipart/form-data; boundary={boundary}", body)
    assert upload.fields == {"purpose": "batch"} and upload.filename == "in.jsonl"
    assert upload.content == f'{{"a": "--{boundary} inside a line"}}\r\n{{"b": 2}}\n'.encode()


@pytest.mark.parametrize(
    ("content_type", "body"),
    [("application/json", b"{}"), ("multipart/form-data; boundary=x", b"--x\r\nno end")],
)
def test_bad_multipart_is_422(content_type: str, body: bytes) -> None:
    with pytest.raises(ApiError) as info:
        parse_multipart(content_type, body)
    assert info.value.status == 422


def test_status_transitions() -> None:
    assert may_move("validating", BatchStatus.IN_PROGRESS)
    assert may_move("in_progress", BatchStatus.CANCELLING)
    assert may_move("finalizing", BatchStatus.EXPIRED)
    assert not may_move("finalizing", BatchStatus.CANCELLING)  # too late to cancel
    assert not may_move("validating", BatchStatus.COMPLETED)  # not without its files
    for final in FINAL:  # a final status is final
        assert not NEXT.get(final) and not any(may_move(final, s) for s in BatchStatus)
    reachable = {BatchStatus.VALIDATING} | {s for targets in NEXT.values() for s in targets}
    assert reachable == set(BatchStatus)
    assert time_field(BatchStatus.CANCELLING) == "cancelling_at"


def test_batch_body_is_openais_object() -> None:
    fields = {"id": "batch_x", "status": "in_progress", "owner": "t", "endpoint": CHAT,
              "input_file_id": "file-1", "completion_window": "24h", "created_at": "5",
              "expires_at": "86405", "in_progress_at": "6", "total": "20", "submitted": "9",
              "metadata": '{"k": "v"}'}  # fmt: skip
    body = batch_body(fields, completed=7, failed=2)
    assert body["request_counts"] == {"total": 20, "completed": 7, "failed": 2}
    assert body["object"] == "batch" and body["in_progress_at"] == 6
    assert body["metadata"] == {"k": "v"} and body["completed_at"] is None
    assert "owner" not in body and "submitted" not in body and body["output_file_id"] is None
