"""The whole path with the bundled SmolLM2-135M: producers on threads and asyncio, one worker.

The must-show of the job plane: 24 concurrent jobs, each stream contiguous from index 0 with one
terminal event, each text equal to the offline engine's greedy output, each status hash in
agreement with its stream.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from producer import AsyncProducer, JobState, Producer
from producer.protocol import DoneEvent, Event
from tests.service.conftest import running_worker
from tests.service.streams import check_stream
from worker.engine.config import EngineConfig, SchedulerConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

SUBJECTS = ["the sea", "a lift", "Paris", "bread", "a robot", "winter", "music", "a river"]
NUM_THREADS, JOBS_PER_THREAD, NUM_ASYNC = 4, 4, 8  # 16 from threads + 8 from asyncio = 24


def job_inputs() -> list[dict[str, object]]:
    """24 jobs: plain prompts and chat messages, output lengths 8-22."""
    jobs: list[dict[str, object]] = []
    for i in range(NUM_THREADS * JOBS_PER_THREAD + NUM_ASYNC):
        subject = SUBJECTS[i % len(SUBJECTS)]
        max_tokens = 8 + (i * 5) % 15
        if i % 2:
            jobs.append(
                {
                    "messages": [{"role": "user", "content": f"Say something about {subject}."}],
                    "max_tokens": max_tokens,
                }
            )
        else:
            jobs.append({"prompt": f"A short note on {subject}:", "max_tokens": max_tokens})
    return jobs


def test_24_concurrent_jobs_through_redis_equal_the_offline_engine(
    smol_model_dir: Path, redis_url: str, prefix: str
) -> None:
    engine = LLMEngine(
        EngineConfig(model=str(smol_model_dir), scheduler=SchedulerConfig(max_num_seqs=32))
    )
    jobs = job_inputs()
    prompts = [j.get("prompt") or j["messages"] for j in jobs]
    params = [SamplingParams(temperature=0.0, max_tokens=int(j["max_tokens"])) for j in jobs]  # type: ignore[call-overload]
    offline = engine.generate(prompts, params)  # type: ignore[arg-type]

    job_ids: dict[int, str] = {}
    lock = threading.Lock()

    def submit_from_thread(thread_index: int) -> None:
        with Producer(redis_url, prefix=prefix) as p:
            for k in range(JOBS_PER_THREAD):
                i = thread_index * JOBS_PER_THREAD + k
                handle = p.submit(temperature=0.0, **jobs[i])  # type: ignore[arg-type]
                with lock:
                    job_ids[i] = handle.job_id

    async def submit_and_follow_async() -> dict[int, list[Event]]:
        async with AsyncProducer(redis_url, prefix=prefix) as ap:
            first = NUM_THREADS * JOBS_PER_THREAD
            handles = {
                i: await ap.submit(temperature=0.0, **jobs[i]) for i in range(first, len(jobs))
            }  # type: ignore[arg-type]

            async def follow(i: int) -> tuple[int, list[Event]]:
                return i, [e async for e in handles[i].stream(timeout_s=300)]

            followed = await asyncio.gather(*(follow(i) for i in handles))
            for i, h in handles.items():
                job_ids[i] = h.job_id
            return dict(followed)

    with running_worker(engine, redis_url, prefix):
        threads = [
            threading.Thread(target=submit_from_thread, args=(t,)) for t in range(NUM_THREADS)
        ]
        for t in threads:
            t.start()
        async_events = asyncio.run(submit_and_follow_async())
        for t in threads:
            t.join()
        with Producer(redis_url, prefix=prefix) as p:
            for i in range(len(jobs)):
                p.result(job_ids[i], timeout_s=300)
            streams = {i: list(p.stream(job_ids[i])) for i in range(len(jobs))}
            statuses = {i: p.status(job_ids[i]) for i in range(len(jobs))}

    for i, events in streams.items():
        if i in async_events:  # what the asyncio client saw live is the stored stream
            assert [e.event_id for e in async_events[i]] == [e.event_id for e in events]
        token_ids = check_stream(events)
        assert token_ids == list(offline[i].token_ids), i
        text = "".join(getattr(e, "text", "") for e in events)
        assert text == offline[i].text, i
        done = events[-1]
        assert isinstance(done, DoneEvent)
        status = statuses[i]
        assert status.state is JobState.DONE
        assert status.finish_reason == done.finish_reason == offline[i].finish_reason
        assert status.completion_tokens == done.usage.completion_tokens == len(token_ids)
        assert status.prompt_tokens == done.usage.prompt_tokens == offline[i].num_prompt_tokens
        assert status.started_at is not None and status.finished_at is not None
        assert status.submitted_at <= status.started_at <= status.finished_at  # type: ignore[operator]
    assert engine.block_manager.num_free_blocks == engine.runner.num_blocks
