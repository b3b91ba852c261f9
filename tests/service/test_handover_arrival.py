"""A claimed job reaches the engine with its submission on the engine's clock (``arrival_time``),
so the engine ages it from its submission: its wait in Redis, and whatever it waits after the
claim (the worker's inbox, a constraint's compile), all count."""

from __future__ import annotations

import time

from producer.protocol import JobSpec
from worker.engine.sampling_params import SamplingParams
from worker.service.config import WorkerConfig
from worker.service.handover import Handover
from worker.service.inbox import Inbox


def handover(clock_offset_s: float = 0.0) -> Handover:
    h = Handover(WorkerConfig(name="w1"), Inbox())
    h.clock_offset_s = clock_offset_s
    return h


def test_the_wait_in_redis_moves_onto_the_engine_clock() -> None:
    submitted_at = time.time() - 5.0
    waited_s = time.monotonic() - handover().arrival_time(submitted_at)
    assert abs(waited_s - 5.0) < 0.5  # float time.time(): not exactly 5


def test_the_redis_clock_decides_the_wait() -> None:
    # This host is 3 s behind the Redis server: the job waited 3 s more than this clock says.
    redis_now = time.time() + 3.0
    waited_s = time.monotonic() - handover(3.0).arrival_time(redis_now - 5.0)
    assert abs(waited_s - 5.0) < 0.5  # float time.time(): not exactly 5


def test_a_submission_ahead_of_the_clock_arrives_now() -> None:
    before = time.monotonic()
    arrival = handover().arrival_time(time.time() + 60.0)  # a skewed clock: never negative
    assert before <= arrival <= time.monotonic()


def test_the_engine_request_carries_the_arrival() -> None:
    spec = JobSpec.model_validate({"id": "j1", "prompt": "hi", "priority": 10})
    before = time.monotonic()
    job = handover().job(("s", "1-0"), spec, [1, 2], SamplingParams(), time.time() - 2.0, 0.0)
    arrival = job.request.arrival_time
    assert arrival is not None
    assert abs((before - arrival) - 2.0) < 0.5
