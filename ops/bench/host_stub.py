"""The engine with no device work: its model's layers and its sampler give fixed answers.

``host_overhead.py --stub-device`` times the engine's host work alone this way. On the CPU the
real forward and sampler of a 256-row step write and read ~50 MB (the (256, 49,152) fp32
logits and the LM head), and the host phases after them run on caches they evicted: the same
engine's host measured 2.56-2.75 ms a step in `host_overhead.py --coarse` and 1.36 ms stubbed
(256 rows, thread CPU, 2-core Zen 4; BENCHMARKS.md). A GPU host reads its logits' ids only,
so the stubbed figure is nearer what it pays; it is still a CPU's Python, not a GPU machine's.

What stays real: scheduling, the block tables and the step's input tensors (`prepare`), the
runner's bookkeeping, the sampling requests, the scheduler's update, stop checks,
detokenizing and the outputs. What is fixed: the layers return zeros, the LM head a
preallocated logits view, and the sampler's choice of ids the next id of a cycle of ordinary
text tokens per row, so the detokenizer sees real text (the sampler's own checks and its
logprobs pass stay).

Every loop runs stubbed. With ``device_s`` > 0 a `StubDevice` stands for a device whose step
takes that long, as CUDA runs one: the forward only enqueues the step (it starts when the
device is free, and ends ``device_s`` later), and the host waits where it reads the sampled ids
(`.tolist()`), asleep, so the interpreter is free. The plain loop then waits for every step
right after its launch; the overlapped loop (``async``, as CUDA runs it) schedules and launches
step N+1 first. The device's idle time between two steps is what of the host's work is on the
critical path. A model of a device, not one: no launch cost and no copies.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from worker.engine.llm_engine import LLMEngine
from worker.engine.sampling_rows import SamplingRequest
from worker.models.config import ModelConfig


class StubDevice:
    """Steps of ``step_s`` each, run one after another in launch order; the idle time between
    them is summed for `take_idle`."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.free_at: float | None = None  # `perf_counter` when the last launched step ends
        self._idle_s = 0.0

    def launch(self) -> None:
        now = time.perf_counter()
        free_at = now if self.free_at is None else self.free_at
        self._idle_s += max(0.0, now - free_at)
        self.free_at = max(now, free_at) + self.step_s

    def wait(self, until: float) -> None:
        """Until ``until``: asleep, then the last 0.2 ms awake (a sleep ends ~0.05-0.1 ms late,
        which would count as the device's idle time)."""
        if (left := until - time.perf_counter() - 2e-4) > 0:
            time.sleep(left)
        while time.perf_counter() < until:
            pass

    def take_idle(self) -> float:
        """Idle seconds since the last call."""
        idle, self._idle_s = self._idle_s, 0.0
        return idle


class DeviceIds(torch.Tensor):
    """Sampled ids that reach the host when their step ends on the `StubDevice`."""

    device_stub: StubDevice | None = None
    done_at = 0.0

    def tolist(self) -> Any:
        if self.device_stub is not None:
            self.device_stub.wait(self.done_at)
        return super().tolist()


class FixedIds:
    """A sampler's choice of ids: row i of call s gets ``token_ids[(s + i) % len(token_ids)]``,
    ready when the step that made them ends on ``device``, if given."""

    def __init__(self, token_ids: Sequence[int], device: StubDevice | None = None) -> None:
        self._ids = list(token_ids)
        self._step = 0
        self._device = device

    def __call__(self, logits: torch.Tensor, requests: Sequence[SamplingRequest]) -> torch.Tensor:
        ids, n, step = self._ids, len(self._ids), self._step
        self._step += 1
        picked = torch.tensor([ids[(step + i) % n] for i in range(len(requests))])
        if self._device is None:
            return picked
        out = picked.as_subclass(DeviceIds)
        out.device_stub, out.done_at = self._device, self._device.free_at or 0.0
        return out


class ZeroLayers:
    """The model's call with no work: zero hidden states, the step enqueued on ``device`` if
    given. Its ``config`` stays the real model's (the runner reads the vocabulary size from it
    for a step that samples nothing)."""

    def __init__(
        self, config: ModelConfig, max_tokens: int, device: StubDevice | None = None
    ) -> None:
        self.config = config
        self._hidden = torch.zeros(max_tokens, config.hidden_size)
        self._device = device

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: Any) -> torch.Tensor:
        if self._device is not None:
            self._device.launch()
        return self._hidden[: input_ids.shape[0]]


def stub_device_work(
    engine: LLMEngine, token_ids: Sequence[int], device_s: float = 0.0
) -> StubDevice | None:
    """Replace ``engine``'s layers, LM head and the ids its sampler picks, in every loop (the
    overlapped loop's launcher holds the same runner and sampler); the `StubDevice` of
    ``device_s`` > 0."""
    runner, scheduler = engine.runner, engine.config.scheduler
    device = StubDevice(device_s) if device_s > 0 else None
    layers = ZeroLayers(engine.model_config, scheduler.max_num_batched_tokens, device)
    runner.model = layers  # type: ignore[assignment]
    logits = torch.zeros(scheduler.max_num_seqs, engine.model_config.vocab_size)
    runner.compute_logits = lambda rows: logits[: rows.shape[0]]  # type: ignore[assignment]
    engine.sampler.sample_ids = FixedIds(token_ids, device)  # type: ignore[method-assign]
    return device
