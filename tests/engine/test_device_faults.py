"""A sticky device error ends the step loop at once, with every request intact (`DeviceFault`).

CUDA's illegal-address and device-side-assert errors poison the context: the per-sequence retry
of `step_faults` would fail every request of the step for the device's fault. Injected on the
CPU as torch raises them on CUDA (`torch.AcceleratorError`, or a RuntimeError saying so).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.test_engine import PROMPTS
from worker.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine.sampling_params import SamplingParams
from worker.engine.scheduler_output import SchedulerOutput
from worker.engine.step_faults import DeviceFault, is_device_fault
from worker.engine.step_launch import InFlight

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
ILLEGAL = "CUDA error: an illegal memory access was encountered"


@pytest.mark.parametrize(
    ("exc", "sticky"),
    [
        (torch.AcceleratorError(ILLEGAL), True),
        (RuntimeError("CUDA error: device-side assert triggered"), True),
        (RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmEx"), True),
        (DeviceFault("already one"), True),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), False),
        (torch.AcceleratorError("CUDA error: out of memory"), False),  # the context survives
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
        (ValueError("CUDA error: in a ValueError's text"), False),  # not torch's
    ],
)
def test_which_errors_are_device_faults(exc: BaseException, sticky: bool) -> None:
    assert is_device_fault(exc) is sticky


def make(model_dir: Path, mode: str) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            overlap_steps=mode,  # type: ignore[arg-type]
            cache=CacheConfig(block_size=4, num_blocks=256),
            scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64),
        )
    )


def step_until_fault(engine: LLMEngine, limit: int = 20) -> int:
    """Step until `DeviceFault`; the number of calls that returned before it."""
    for calls in range(limit):
        try:
            engine.step()
        except DeviceFault:
            return calls
    raise AssertionError("no DeviceFault")


def assert_intact_and_abortable(engine: LLMEngine, ids: list[str]) -> None:
    """Every request is still in the engine (to be handed back), and aborts free all blocks."""
    assert sorted(engine._requests) == sorted(ids)
    assert all(engine.abort(rid) for rid in ids)
    assert engine.block_manager.num_free_blocks == engine.runner.num_blocks
    engine.block_manager.assert_invariants([])


@pytest.mark.parametrize("mode", ["off", "async", "thread"])
def test_a_runner_device_fault_ends_the_loop_without_retrying_rows(
    tiny_model_dir: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make(tiny_model_dir, mode)
    ids = [f"r{i}" for i in range(3)]
    for rid, prompt in zip(ids, PROMPTS, strict=False):
        engine.add_prompt(rid, prompt, GREEDY)
    real, calls = engine.runner.run, []

    def faulting(decision: SchedulerOutput) -> Any:
        calls.append(len(decision.scheduled))
        if len(calls) > 3:  # a few good steps first, the requests mid-decode
            raise torch.AcceleratorError(ILLEGAL)
        return real(decision)

    monkeypatch.setattr(engine.runner, "run", faulting)
    assert step_until_fault(engine) >= 3
    assert len(calls) == 4  # the faulted step once: no sequence-by-sequence retry
    assert isinstance(engine.device_fault, DeviceFault)
    assert ILLEGAL in str(engine.device_fault)
    with pytest.raises(DeviceFault):  # and every later call, without touching the device
        engine.step()
    assert len(calls) == 4
    assert_intact_and_abortable(engine, ids)


@pytest.mark.parametrize("mode", ["off", "async", "thread"])
def test_a_sampler_device_fault_ends_the_loop_without_retrying_rows(
    tiny_model_dir: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make(tiny_model_dir, mode)
    ids = ["a", "b"]
    for rid, prompt in zip(ids, PROMPTS, strict=False):
        engine.add_prompt(rid, prompt, GREEDY)
    real, calls = type(engine.sampler).sample_ids, []

    def faulting(self: Any, logits: torch.Tensor, requests: Any) -> Any:
        calls.append(len(requests))
        if len(calls) > 2:
            raise RuntimeError("CUDA error: device-side assert triggered")
        return real(self, logits, requests)

    monkeypatch.setattr(type(engine.sampler), "sample_ids", faulting)
    step_until_fault(engine)
    assert len(calls) == 3  # not once more per row
    assert_intact_and_abortable(engine, ids)


def test_a_fault_reported_at_the_wait_for_the_ids_is_a_device_fault(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On CUDA a kernel's error surfaces at the next synchronising call: `InFlight.result`."""
    pending = InFlight((7,), torch.tensor([3]))

    def fail(self: torch.Tensor) -> list[int]:
        raise torch.AcceleratorError(ILLEGAL)

    monkeypatch.setattr(torch.Tensor, "tolist", fail)
    with pytest.raises(DeviceFault, match="illegal memory access"):
        pending.result()


def test_an_ordinary_error_at_the_wait_is_raised_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    pending = InFlight((7,), torch.tensor([3]))

    def fail(self: torch.Tensor) -> list[int]:
        raise KeyError("not the device")

    monkeypatch.setattr(torch.Tensor, "tolist", fail)
    with pytest.raises(KeyError):
        pending.result()
