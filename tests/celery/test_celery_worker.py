"""The bridge end to end: a real ``celery worker`` runs ``paternoster.generate`` tasks whose jobs
a real JobWorker serves on the tiny model; chains, chords, revokes and token callbacks."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from celery import chain, chord, states

from producer import JobState, Producer
from producer.celery import GenerateFailed, stream_tokens
from producer.protocol import TokenEvent
from tests.celery.conftest import SlowStep
from worker.service.worker import JobWorker

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("celery_worker")]
RESULT_TIMEOUT_S = 30
GREEDY = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}


def wait_for_state(jobs: Producer, job_id: str, wanted: JobState, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    state = None
    while time.monotonic() < deadline:
        state = jobs.redis.hget(jobs.keys.job(job_id), "state")
        if state == wanted.value:
            return
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} is {state!r}, not {wanted.value}, after {timeout_s} s")


def test_generate_returns_a_json_result_and_uses_the_task_id(
    celery_app: Any, jobs: Producer
) -> None:
    async_result = celery_app.generate.delay(prompt="The sky is", **GREEDY)
    out = async_result.get(timeout=RESULT_TIMEOUT_S)
    assert json.loads(json.dumps(out)) == out
    assert out["job_id"] == async_result.id  # job id = task id: a retry resubmits the same job
    assert len(out["token_ids"]) == 6 and out["text"]
    assert out["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 6
    assert out["timings"]["total_s"] >= out["timings"]["queued_s"]
    assert jobs.status(out["job_id"]).state is JobState.DONE


def test_a_chain_feeds_one_result_into_the_next_prompt(celery_app: Any, jobs: Producer) -> None:
    flow = chain(
        celery_app.generate.s(prompt="Once upon a time", **GREEDY),
        celery_app.generate.s(template="Continue: {text}", **GREEDY),
    )
    async_result = flow.apply_async()
    second = async_result.get(timeout=RESULT_TIMEOUT_S)
    first = async_result.parent.get(timeout=RESULT_TIMEOUT_S)
    assert second["finish_reason"] == "length" and len(second["token_ids"]) == 6
    # "Continue: " plus the first's text (the exact prompt is checked in test_eager.py): more
    # prompt tokens than either the first job's prompt or "Continue: " alone.
    assert second["usage"]["prompt_tokens"] > first["usage"]["prompt_tokens"]


def test_a_chord_gathers_every_result_in_order(celery_app: Any) -> None:
    prompts = ["Red", "Green and", "Blue is a colour"]
    header = [celery_app.generate.s(prompt=p, **GREEDY) for p in prompts]
    joined = chord(header)(celery_app.join_texts.s()).get(timeout=RESULT_TIMEOUT_S)
    alone = [celery_app.generate.delay(prompt=p, **GREEDY) for p in prompts]
    texts = [r.get(timeout=RESULT_TIMEOUT_S)["text"] for r in alone]
    assert joined == "|".join(texts)  # greedy: the same text whether in a chord or not


def test_revoking_a_running_task_cancels_its_job(
    celery_app: Any, jobs: Producer, slow_steps: SlowStep
) -> None:
    slow_steps.delay_s = 0.02  # 400 tokens: 8 s, far longer than the revoke takes
    async_result = celery_app.generate.delay(
        prompt="Tell a long story", max_tokens=400, ignore_eos=True
    )
    wait_for_state(jobs, async_result.id, JobState.RUNNING)
    celery_app.control.revoke(async_result.id)
    wait_for_state(jobs, async_result.id, JobState.CANCELLED, timeout_s=5)
    status = jobs.status(async_result.id)
    assert status.completion_tokens is not None and status.completion_tokens < 400
    deadline = time.monotonic() + 5
    while async_result.state != states.REVOKED and time.monotonic() < deadline:
        time.sleep(0.05)
    assert async_result.state == states.REVOKED


def test_revoking_a_queued_task_leaves_no_job(celery_app: Any, jobs: Producer) -> None:
    async_result = celery_app.generate.apply_async(
        kwargs={"prompt": "Never", **GREEDY}, countdown=30
    )
    celery_app.control.revoke(async_result.id)
    deadline = time.monotonic() + 5
    while async_result.state != states.REVOKED and time.monotonic() < deadline:
        time.sleep(0.05)
    assert async_result.state == states.REVOKED
    assert not jobs.redis.exists(jobs.keys.job(async_result.id))


def test_stream_tokens_calls_back_for_every_token(jobs: Producer, job_worker: JobWorker) -> None:
    seen: list[TokenEvent] = []
    job = jobs.submit("Streaming", max_tokens=8, temperature=0, ignore_eos=True)
    result = stream_tokens(jobs, job.job_id, seen.append)
    assert "".join(e.text for e in seen) == result.text
    assert [t for e in seen for t in e.token_ids] == result.token_ids
    assert len(result.token_ids) == 8


def test_a_failed_job_reaches_the_caller_as_generate_failed(celery_app: Any) -> None:
    async_result = celery_app.generate.delay(prompt="word " * 600, max_tokens=4)
    with pytest.raises(GenerateFailed, match="prompt_too_long") as info:
        async_result.get(timeout=RESULT_TIMEOUT_S)
    assert (info.value.state, info.value.code) == ("error", "prompt_too_long")
    assert async_result.state == states.FAILURE


def test_a_refused_submit_is_retried_until_admitted(celery_app: Any, jobs: Producer) -> None:
    tenant = f"full-{uuid.uuid4().hex[:8]}"
    jobs.redis.hset(jobs.keys.limits, f"tenant:{tenant}:jobs", 0)  # every submit refused
    try:
        async_result = celery_app.generate.delay(prompt="Admitted later", tenant=tenant, **GREEDY)
        deadline = time.monotonic() + 15
        while async_result.state != states.RETRY and time.monotonic() < deadline:
            time.sleep(0.05)
        assert async_result.state == states.RETRY
        assert not jobs.redis.exists(jobs.keys.job(async_result.id))
    finally:
        jobs.redis.hdel(jobs.keys.limits, f"tenant:{tenant}:jobs")
    out = async_result.get(timeout=RESULT_TIMEOUT_S)  # the next retry, 1 to 3 s later, is let in
    assert out["job_id"] == async_result.id and len(out["token_ids"]) == 6
    assert jobs.status(async_result.id).tenant == tenant
