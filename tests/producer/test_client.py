"""The sync Producer against a real Redis, with a fake worker writing what a worker writes."""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis

from producer import (
    JobCancelled,
    JobExpired,
    JobFailed,
    JobNotFound,
    JobState,
    JobTimeout,
    Keys,
    Producer,
)
from producer.protocol import TokenEvent
from tests.producer.fake_worker import FakeWorker


def run_job(worker: FakeWorker, pieces: list[tuple[str, list[int]]], reason: str = "length") -> str:
    """Take the next job, publish one token event per piece, then ``done``; its id."""
    job = worker.take()
    assert job.outcome == "started"
    for text, ids in pieces:
        worker.token(job, text, ids)
    worker.done(job, reason)
    return job.job_id


def test_submit_enqueues_one_entry_and_a_queued_status(
    producer: Producer, client: redis.Redis, keys: Keys
) -> None:
    handle = producer.submit("Hello", max_tokens=8, job_id="job-1", tenant="acme", priority=-5)
    assert handle.created and handle.job_id == "job-1"
    assert not client.exists(keys.jobs)  # priority -5: the interactive band's stream
    [(entry_id, fields)] = client.xrange(keys.band("interactive"))
    assert fields["id"] == "job-1"
    payload = json.loads(fields["payload"])
    assert payload["prompt"] == "Hello" and payload["sampling"]["max_tokens"] == 8
    status = producer.status("job-1")
    assert status.state is JobState.QUEUED
    assert (status.tenant, status.priority, status.band) == ("acme", -5, "interactive")
    assert status.submitted_at == pytest.approx(time.time(), abs=60)
    assert client.hget(keys.job("job-1"), "stream_id") == entry_id
    assert client.ttl(keys.job("job-1")) == -1  # a queued job does not expire


def test_submitting_an_id_twice_adds_nothing_the_second_time(
    producer: Producer, client: redis.Redis, keys: Keys
) -> None:
    first = producer.submit("first", job_id="same")
    second = producer.submit("second", job_id="same")
    assert (first.created, second.created) == (True, False)
    [(_, fields)] = client.xrange(keys.jobs)
    assert json.loads(fields["payload"])["prompt"] == "first"


def test_unknown_ids_raise_job_not_found(producer: Producer) -> None:
    with pytest.raises(JobNotFound):
        producer.status("nope")
    with pytest.raises(JobNotFound) as info:
        producer.cancel("nope")
    assert isinstance(info.value, KeyError) and "nope" in str(info.value)
    with pytest.raises(JobNotFound):
        next(iter(producer.stream("nope")))


def test_cancel_of_a_queued_job_ends_it_and_the_claim_then_skips_it(
    producer: Producer, client: redis.Redis, keys: Keys, worker: FakeWorker
) -> None:
    producer.submit("x", job_id="q")
    assert producer.cancel("q") == "cancelled"
    status = producer.status("q")
    assert status.state is JobState.CANCELLED and status.finished_at is not None
    assert [e.type for e in producer.stream("q")] == ["cancelled"]
    for key in (keys.job("q"), keys.events("q")):
        assert 0 < client.ttl(key) <= producer.result_ttl_s
    # A worker reads the entry later: the claim acknowledges it and starts nothing.
    got = worker.read()
    assert got is not None
    assert worker.pending() == 1
    job = worker.claim(got[0], "q")
    assert job.outcome == "cancelled"
    assert worker.pending() == 0
    assert client.xlen(keys.events("q")) == 1
    assert producer.cancel("q") == "cancelled"  # again: the state it has


def test_cancel_of_a_running_job_flags_it_and_tells_the_workers(
    producer: Producer, client: redis.Redis, keys: Keys, worker: FakeWorker
) -> None:
    producer.submit("x", job_id="r")
    job = worker.take()
    worker.token(job, "par", [5, 6])
    assert producer.cancel("r") == "cancelling"
    status = producer.status("r")
    assert status.state is JobState.RUNNING and status.cancel_requested
    [(_, fields)] = client.xrange(keys.cancels)
    assert fields == {"id": "r"}
    assert client.ttl(keys.job("r")) == -1
    worker.cancelled(job)
    with pytest.raises(JobCancelled) as info:
        producer.result("r")
    partial = info.value.result
    assert (partial.state, partial.text, partial.token_ids) == (JobState.CANCELLED, "par", [5, 6])
    assert partial.usage is not None and partial.usage.completion_tokens == 2
    assert producer.cancel("r") == "cancelled"


def test_cancel_of_a_finished_job_returns_its_state(producer: Producer, worker: FakeWorker) -> None:
    producer.submit("x", job_id="d")
    run_job(worker, [("a", [1])])
    assert producer.cancel("d") == "done"
    assert producer.status("d").state is JobState.DONE


def test_result_of_a_done_job(
    producer: Producer, client: redis.Redis, keys: Keys, worker: FakeWorker
) -> None:
    handle = producer.submit("x", job_id="ok")
    run_job(worker, [("Hel", [1, 2]), ("lo", [3])], reason="stop")
    result = handle.result(timeout_s=5)
    assert (result.state, result.text, result.token_ids) == (JobState.DONE, "Hello", [1, 2, 3])
    assert result.finish_reason == "stop" and result.worker == "fake-worker"
    assert result.usage is not None and result.usage.completion_tokens == 3
    assert result.timings is not None and result.timings.total_s >= result.timings.queued_s
    status = producer.status("ok")
    assert status.state is JobState.DONE and status.completion_tokens == 3
    assert status.first_token_at is not None and status.worker == "fake-worker"
    assert worker.pending() == 0
    assert 0 < client.ttl(keys.events("ok"))


def test_result_of_a_rejected_job_raises_job_failed(producer: Producer, worker: FakeWorker) -> None:
    producer.submit("x", job_id="bad")
    got = worker.read()
    assert got is not None
    worker.reject(got[0], "bad", "prompt_too_long", "prompt of 9000 tokens > 2048")
    with pytest.raises(JobFailed) as info:
        producer.result("bad")
    assert info.value.code == "prompt_too_long"
    assert info.value.result.state is JobState.ERROR and info.value.result.text == ""
    status = producer.status("bad")
    assert (status.state, status.error_code) == (JobState.ERROR, "prompt_too_long")
    assert worker.pending() == 0


def test_result_of_a_job_that_failed_while_running_keeps_the_partial_text(
    producer: Producer, worker: FakeWorker
) -> None:
    producer.submit("x", job_id="mid")
    job = worker.take()
    worker.token(job, "half", [9])
    worker.fail(job, "internal", "device lost")
    with pytest.raises(JobFailed, match="device lost") as info:
        producer.result("mid")
    assert (info.value.code, info.value.result.text) == ("internal", "half")


def test_result_of_a_job_cancelled_while_queued_raises_job_cancelled(producer: Producer) -> None:
    producer.submit("x", job_id="c")
    producer.cancel("c")
    with pytest.raises(JobCancelled) as info:
        producer.result("c")
    assert info.value.result.state is JobState.CANCELLED and info.value.result.usage is None


def test_a_job_past_its_deadline_expires_at_the_claim(
    producer: Producer, worker: FakeWorker
) -> None:
    producer.submit("x", job_id="late", deadline_s=-1)
    job = worker.take()
    assert job.outcome == "expired"
    with pytest.raises(JobExpired, match="deadline") as info:
        producer.result("late")
    assert info.value.result.state is JobState.EXPIRED
    assert producer.status("late").state is JobState.EXPIRED
    assert [e.type for e in producer.stream("late")] == ["expired"]
    assert worker.pending() == 0


def test_a_deadline_not_yet_passed_starts(producer: Producer, worker: FakeWorker) -> None:
    producer.submit("x", job_id="soon", deadline_s=60)
    assert worker.take().outcome == "started"


def test_result_times_out_on_a_job_nobody_runs(producer: Producer) -> None:
    producer.submit("x", job_id="idle")
    start = time.monotonic()
    with pytest.raises(JobTimeout):
        producer.result("idle", timeout_s=0.3)
    assert time.monotonic() - start < 2.0
    assert producer.status("idle").state is JobState.QUEUED


def test_stream_resumes_after_an_event_id_without_duplicates(
    producer: Producer, worker: FakeWorker
) -> None:
    producer.submit("x", job_id="s")
    run_job(worker, [("a", [1]), ("b", [2]), ("c", [3])])
    everything = list(producer.stream("s"))
    assert [e.type for e in everything] == ["started", "token", "token", "token", "done"]
    first_two = []
    for event in producer.stream("s"):
        first_two.append(event)
        if len(first_two) == 2:
            break
    rest = list(producer.stream("s", from_event=first_two[1].event_id or ""))
    assert [e.event_id for e in first_two + rest] == [e.event_id for e in everything]
    tokens = [e for e in everything if isinstance(e, TokenEvent)]
    assert [e.index for e in tokens] == [0, 1, 2]


def test_a_handle_resumes_where_its_last_stream_stopped(
    producer: Producer, worker: FakeWorker
) -> None:
    handle = producer.submit("x", job_id="h")
    run_job(worker, [("a", [1]), ("b", [2])])
    seen = []
    for event in handle.stream():
        seen.append(event.type)
        break
    seen += [event.type for event in handle.stream()]
    assert seen == ["started", "token", "token", "done"]


def test_stream_follows_events_as_a_worker_publishes_them(
    producer: Producer, worker: FakeWorker
) -> None:
    handle = producer.submit("x", job_id="live")

    def work() -> None:
        job = worker.take()
        for i in range(3):
            time.sleep(0.05)
            worker.token(job, str(i), [i])
        worker.done(job)

    thread = threading.Thread(target=work)
    thread.start()
    try:
        texts = [e.text for e in handle.stream(timeout_s=10) if isinstance(e, TokenEvent)]
    finally:
        thread.join()
    assert texts == ["0", "1", "2"]


def test_a_job_added_by_hand_with_xadd_is_claimed(
    producer: Producer, client: redis.Redis, keys: Keys, worker: FakeWorker
) -> None:
    payload = json.dumps({"id": "raw-1", "prompt": "hi"})
    client.xadd(keys.jobs, {"id": "raw-1", "payload": payload})
    job = worker.take()
    assert (job.job_id, job.outcome) == ("raw-1", "started")
    status = producer.status("raw-1")
    assert status.state is JobState.RUNNING and status.submitted_at is not None
    worker.token(job, "ok", [1])
    worker.done(job)
    assert producer.result("raw-1").text == "ok"


def test_readers_skip_event_types_and_fields_they_do_not_know(
    producer: Producer, worker: FakeWorker
) -> None:
    """A newer worker may add an event type or a field: a deployed client reads on."""
    handle = producer.submit("hi", max_tokens=2)
    job = worker.take()
    events = producer.keys.events(job.job_id)
    producer.redis.xadd(events, {"type": "progress", "data": json.dumps({"type": "progress"})})
    worker.token(job, "a", [7])
    token = {"type": "token", "index": 1, "text": "b", "token_ids": [8], "new_field": 1}
    producer.redis.xadd(events, {"type": "token", "data": json.dumps(token)})
    producer.redis.xadd(events, {"type": "heartbeat", "data": "not even JSON"})
    worker.done(job)
    got = list(producer.stream(handle.job_id, timeout_s=10))
    assert [e.type for e in got] == ["started", "token", "token", "done"]
    result = handle.result(timeout_s=10)
    assert result.text == "ab" and list(result.token_ids) == [7, 8]
