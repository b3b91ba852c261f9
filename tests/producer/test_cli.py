"""The producer subcommands of ``paternoster``, run in-process through ``worker.cli.main``."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import redis

from producer import JobState, Keys, Producer
from tests.producer.fake_worker import FakeWorker
from worker.cli import main

Capsys = pytest.CaptureFixture[str]


@pytest.fixture
def cli(redis_url: str, key_prefix: str, capsys: Capsys) -> Any:
    """``cli("status", "x")`` -> (exit code, stdout, stderr) on this test's prefix."""

    def run(command: str, *args: str) -> tuple[int, str, str]:
        rc = main([command, "--redis-url", redis_url, "--prefix", key_prefix, *args])
        out, err = capsys.readouterr()
        return rc, out, err

    return run


@pytest.fixture
def limits(redis_url: str, key_prefix: str, capsys: Capsys) -> Any:
    """``limits("set", "--band", ...)`` -> (exit code, stdout, stderr) on this test's prefix."""

    def run(action: str, *args: str) -> tuple[int, str, str]:
        rc = main(["limits", action, "--redis-url", redis_url, "--prefix", key_prefix, *args])
        out, err = capsys.readouterr()
        return rc, out, err

    return run


def finish(worker: FakeWorker, pieces: list[str], reason: str = "length") -> None:
    job = worker.take()
    for i, text in enumerate(pieces):
        worker.token(job, text, [100 + i])
    worker.done(job, reason)


def test_submit_prints_the_job_id(cli: Any, producer: Producer) -> None:
    rc, out, err = cli("submit", "Hello there")
    assert rc == 0 and err == ""
    job_id = out.strip()
    assert producer.status(job_id).state is JobState.QUEUED


def test_submit_json_and_resubmit(cli: Any) -> None:
    rc, out, _ = cli("submit", "--json", "--id", "j1", "hi")
    assert rc == 0 and json.loads(out) == {"job_id": "j1", "created": True}
    rc, out, err = cli("submit", "--json", "--id", "j1", "hi")
    assert rc == 0 and json.loads(out) == {"job_id": "j1", "created": False}
    assert "exists already" in err


def test_submit_puts_every_flag_into_the_job(cli: Any, client: redis.Redis, keys: Keys) -> None:
    args = [
        "--id",
        "f",
        "--chat",
        "--priority",
        "7",
        "--tenant",
        "acme",
        "--deadline-s",
        "30",
        "--max-tokens",
        "5",
        "--temperature",
        "0.7",
        "--seed",
        "3",
        "--stop",
        "\n",
        "Q?",
    ]
    rc, _, _ = cli("submit", *args)
    assert rc == 0
    [(_, fields)] = client.xrange(keys.jobs)
    spec = json.loads(fields["payload"])
    assert spec["messages"] == [{"role": "user", "content": "Q?"}] and "prompt" not in spec
    assert (spec["priority"], spec["tenant"]) == (7, "acme")
    assert spec["sampling"]["max_tokens"] == 5 and spec["sampling"]["temperature"] == 0.7
    assert spec["sampling"]["seed"] == 3 and spec["sampling"]["stop"] == ["\n"]
    assert spec["deadline"] > 0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--top-p", "0", "x"], "top_p"),
        (["--id", "bad id", "x"], "id"),
        (["--priority", "1000", "x"], "priority"),
    ],
)
def test_submit_of_an_invalid_job_exits_2_with_one_line(
    cli: Any, client: redis.Redis, keys: Keys, args: list[str], needle: str
) -> None:
    rc, out, err = cli("submit", *args)
    assert rc == 2 and out == ""
    assert err.startswith("paternoster submit: error: invalid job:") and needle in err
    assert err.count("\n") == 1
    assert not client.exists(keys.jobs)


@pytest.mark.parametrize("command", ["status", "stream", "result", "cancel"])
def test_unknown_ids_exit_2(cli: Any, command: str) -> None:
    rc, out, err = cli(command, "nope")
    assert rc == 2 and out == ""
    assert (
        err
        == f"paternoster {command}: error: no job 'nope' (never submitted, or its result expired)\n"
    )


def test_status_plain_and_json(cli: Any, producer: Producer) -> None:
    producer.submit("x", job_id="s", tenant="acme")
    rc, out, _ = cli("status", "s")
    assert rc == 0
    lines = dict(line.split(":", 1) for line in out.splitlines())
    assert lines["state"].strip() == "queued" and lines["tenant"].strip() == "acme"
    assert lines["submitted_at"].strip().endswith("+00:00")
    value_columns = {len(line) - len(line.split(":", 1)[1].lstrip()) for line in out.splitlines()}
    assert len(value_columns) == 1  # aligned
    rc, out, _ = cli("status", "--json", "s")
    status = json.loads(out)
    assert rc == 0 and status["job_id"] == "s" and status["state"] == "queued"
    assert isinstance(status["submitted_at"], float) and status["cancel_requested"] is False


def test_cancel_prints_the_outcome(cli: Any, producer: Producer, worker: FakeWorker) -> None:
    producer.submit("x", job_id="q")
    assert cli("cancel", "q") == (0, "cancelled\n", "")
    rc, out, _ = cli("cancel", "--json", "q")
    assert rc == 0 and json.loads(out) == {"job_id": "q", "outcome": "cancelled"}
    producer.submit("x", job_id="r")
    worker.read()
    worker.take()
    assert cli("cancel", "r") == (0, "cancelling\n", "")


def test_result_of_a_finished_job(cli: Any, producer: Producer, worker: FakeWorker) -> None:
    producer.submit("x", job_id="d")
    finish(worker, ["Hel", "lo"], "stop")
    assert cli("result", "d") == (0, "Hello\n", "")
    rc, out, _ = cli("result", "--json", "d")
    record = json.loads(out)
    assert rc == 0
    assert (record["state"], record["text"], record["finish_reason"]) == ("done", "Hello", "stop")
    assert record["token_ids"] == [100, 101] and record["usage"]["completion_tokens"] == 2
    assert set(record["timings"]) == {"queued_s", "ttft_s", "total_s"}


def test_result_of_a_failed_or_cancelled_job_exits_1(
    cli: Any, producer: Producer, worker: FakeWorker
) -> None:
    producer.submit("x", job_id="bad")
    got = worker.read()
    assert got is not None
    worker.reject(got[0], "bad", "prompt_too_long", "too long")
    rc, out, err = cli("result", "--json", "bad")
    assert rc == 1 and json.loads(out)["error_code"] == "prompt_too_long"
    assert err == "paternoster result: job bad failed: prompt_too_long: too long\n"
    producer.submit("x", job_id="c")
    producer.cancel("c")
    assert cli("result", "c") == (1, "", "paternoster result: job c was cancelled\n")


def test_result_timeout_exits_1(cli: Any, producer: Producer) -> None:
    producer.submit("x", job_id="idle")
    rc, out, err = cli("result", "--timeout-s", "0.2", "idle")
    assert rc == 1 and out == "" and "not finished within 0.2 s" in err


def test_stream_json_prints_one_event_per_line(
    cli: Any, producer: Producer, worker: FakeWorker
) -> None:
    producer.submit("x", job_id="s")
    finish(worker, ["a", "b", "c"])
    rc, out, err = cli("stream", "--json", "s")
    assert rc == 0 and err == ""
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["type"] for e in events] == ["started", "token", "token", "token", "done"]
    assert all(e["event_id"] for e in events)
    assert [e["index"] for e in events if e["type"] == "token"] == [0, 1, 2]
    rc, out, _ = cli("stream", "--json", "--from-event", events[2]["event_id"], "s")
    assert rc == 0 and [json.loads(line) for line in out.splitlines()] == events[3:]


def test_stream_plain_writes_text_and_a_summary(
    cli: Any, producer: Producer, worker: FakeWorker
) -> None:
    producer.submit("x", job_id="p")
    finish(worker, ["Hel", "lo"], "stop")
    rc, out, err = cli("stream", "p")
    assert rc == 0 and out == "Hello\n"
    assert err.startswith("[stop] 2 tokens (prompt 3); queued ")


def test_stream_of_a_cancelled_job_exits_1(cli: Any, producer: Producer) -> None:
    producer.submit("x", job_id="c")
    producer.cancel("c")
    rc, out, err = cli("stream", "--json", "c")
    assert rc == 1 and json.loads(out)["type"] == "cancelled"
    assert err == "paternoster stream: job c was cancelled\n"


def test_submit_stream_follows_the_job(cli: Any, worker: FakeWorker) -> None:
    thread = threading.Thread(target=finish, args=(worker, ["x", "y"]))
    thread.start()
    try:
        rc, out, err = cli("submit", "--stream", "--json", "--id", "live", "go")
    finally:
        thread.join()
    assert rc == 0 and err == "job live\n"
    assert [json.loads(line)["type"] for line in out.splitlines()] == [
        "started",
        "token",
        "token",
        "done",
    ]


def test_no_redis_is_a_clear_error(key_prefix: str, capsys: Capsys) -> None:
    rc = main(["status", "--redis-url", "redis://127.0.0.1:1/0", "--prefix", key_prefix, "x"])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("paternoster status: error: cannot reach Redis:")


def test_submit_takes_a_priority_alias(cli: Any, producer: Producer, keys: Keys) -> None:
    rc, out, _ = cli("submit", "--priority", "batch", "x")
    assert rc == 0 and producer.status(out.strip()).priority == 10
    rc, _, err = cli("submit", "--priority", "urgent", "x")
    assert rc == 2 and "unknown priority 'urgent'" in err and err.count("\n") == 1


def test_a_refused_submit_exits_75_with_one_line(
    cli: Any, limits: Any, client: redis.Redis, keys: Keys
) -> None:
    assert limits("set", "--band", "interactive", "--jobs", "0")[0] == 0
    rc, out, err = cli("submit", "--priority", "interactive", "--id", "no", "x")
    assert rc == 75 and out == ""
    assert err == (
        "paternoster submit: error: overloaded: band:interactive has 0 jobs queued, limit 0;"
        " retry after 1 s (nothing was enqueued)\n"
    )
    assert not client.exists(keys.job("no"), keys.band("interactive"))


def test_limits_set_show_and_clear(limits: Any, producer: Producer) -> None:
    assert limits("set", "--band", "interactive", "--jobs", "100", "--tokens", "50000")[0] == 0
    assert limits("set", "--tenant-default", "--jobs", "20")[0] == 0
    assert limits("set", "--tenant", "acme", "--tokens", "500")[0] == 0
    producer.submit("abcd", max_tokens=3, tenant="acme", priority="interactive")
    rc, out, _ = limits("show", "--json")
    rows = {row.pop("scope"): row for row in json.loads(out)}
    assert rc == 0 and list(rows) == [
        "band:interactive", "band:default", "band:batch", "tenant:*", "tenant:acme"
    ]  # fmt: skip
    assert rows["band:interactive"] == {
        "max_jobs": 100, "max_tokens": 50000, "queued_jobs": 1, "queued_tokens": 4
    }  # fmt: skip
    assert rows["tenant:*"] == {
        "max_jobs": 20, "max_tokens": None, "queued_jobs": None, "queued_tokens": None
    }  # fmt: skip
    assert rows["tenant:acme"]["max_tokens"] == 500 and rows["tenant:acme"]["queued_jobs"] == 1
    rc, out, _ = limits("show")
    lines = out.splitlines()
    assert rc == 0 and lines[1].split() == ["band:interactive", "1/100", "4/50000"]
    assert lines[4].split() == ["tenant:*", "-/20", "-/-"]
    assert limits("clear", "--tenant", "acme")[0] == 0
    assert "tenant:acme" not in limits("show")[1]
    assert limits("clear")[0] == 0
    rows = {row["scope"]: row for row in json.loads(limits("show", "--json")[1])}
    assert all(r["max_jobs"] is None and r["max_tokens"] is None for r in rows.values())


def test_limits_set_needs_a_scope_and_a_value(limits: Any) -> None:
    rc, _, err = limits("set", "--band", "batch")
    assert rc == 2 and "give --jobs, --tokens or both" in err
    with pytest.raises(SystemExit):  # argparse: no scope, or a negative limit
        limits("set", "--jobs", "3")
    with pytest.raises(SystemExit):
        limits("set", "--band", "batch", "--jobs", "-1")


def test_status_shows_why_a_queued_job_waits(cli: Any, producer: Producer) -> None:
    producer.submit("x", job_id="first")
    producer.submit("x", job_id="w")
    rc, out, _ = cli("status", "w")
    lines = {k: v.strip() for k, v in (line.split(":", 1) for line in out.splitlines())}
    assert rc == 0 and (lines["wait_reason"], lines["position"]) == ("no_worker", "1")
    assert lines["band"] == "default"
    status = json.loads(cli("status", "--json", "w")[1])
    assert (status["wait_reason"], status["position"], status["preemptions"]) == (
        "no_worker",
        1,
        None,
    )
