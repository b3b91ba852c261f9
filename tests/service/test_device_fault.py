"""A worker whose device fails hands every job back and stops; another worker finishes them.

The fault is injected on the CPU as torch raises a sticky CUDA error (`torch.AcceleratorError`),
a few steps into decoding: no job may fail for it, none may be lost, each stream stays
contiguous, and the handoff counts as no failed delivery.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from producer import Producer
from tests.service.conftest import running_worker, tiny_engine
from tests.service.streams import check_stream
from tests.service.test_priority import wait_until
from worker.engine.llm_engine import LLMEngine
from worker.engine.sampling_params import SamplingParams
from worker.engine.scheduler_output import SchedulerOutput
from worker.engine.step_faults import DeviceFault

GREEDY: dict[str, Any] = {"temperature": 0.0, "ignore_eos": True}
PROMPTS = ["Hello there", "The capital of France is", "1 2 3 4"]
MAX_TOKENS = 40


def fault_after(engine: LLMEngine, good_steps: int, monkeypatch: pytest.MonkeyPatch) -> None:
    real, calls = engine.runner.run, [0]

    def run(decision: SchedulerOutput) -> Any:
        calls[0] += 1
        if calls[0] > good_steps:
            raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
        return real(decision)

    monkeypatch.setattr(engine.runner, "run", run)


def test_a_device_fault_hands_every_job_back_and_another_worker_finishes_them(
    tiny_model_dir: Path, redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    healthy = tiny_engine(tiny_model_dir)
    expected = healthy.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, **GREEDY))
    faulty = tiny_engine(tiny_model_dir)
    fault_after(faulty, 8, monkeypatch)
    with (
        running_worker(faulty, redis_url, prefix, name="w-faulty") as failing,
        Producer(redis_url, prefix=prefix) as p,
    ):
        handles = [p.submit(t, max_tokens=MAX_TOKENS, **GREEDY) for t in PROMPTS]
        wait_until(lambda: failing.device_fault is not None)
        assert "illegal memory access" in (failing.device_fault or "")
        assert isinstance(faulty.device_fault, DeviceFault)
        # run() returned: its last write done, the lease dropped so the jobs are taken at once.
        wait_until(lambda: not p.redis.exists(p.keys.lease("w-faulty")))
        assert not faulty._requests and not failing.active  # its aborts are never reported
        streamed = [p.redis.hget(p.keys.job(h.job_id), "completion_tokens") for h in handles]
        assert 0 < sum(int(n or 0) for n in streamed) < MAX_TOKENS * len(PROMPTS)  # mid-decode
        with running_worker(healthy, redis_url, prefix, name="w-healthy"):
            for handle, want in zip(handles, expected, strict=True):
                result = handle.result(timeout_s=60)
                assert result.token_ids == list(want.token_ids)  # not failed: finished
                assert check_stream(list(p.stream(handle.job_id))) == list(want.token_ids)
                deliveries = p.redis.hget(p.keys.job(handle.job_id), "deliveries")
                assert deliveries == "1"  # a handoff is no failed delivery
