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
preallocated logits view, and the sampler the next id of a cycle of ordinary text tokens per
row, so the detokenizer sees real text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from worker.engine.llm_engine import LLMEngine
from worker.engine.overlap import overlap_mode
from worker.engine.sampler import SamplerOutput
from worker.engine.sampling_rows import SamplingRequest
from worker.models.config import ModelConfig


class FixedSampler:
    """A sampler's call: row i of a step gets ``token_ids[(step + i) % len(token_ids)]``."""

    def __init__(self, token_ids: Sequence[int]) -> None:
        self._ids = list(token_ids)
        self._step = 0

    def __call__(self, logits: torch.Tensor, requests: Sequence[SamplingRequest]) -> SamplerOutput:
        ids, n, step = self._ids, len(self._ids), self._step
        self._step += 1
        rows = len(requests)
        return SamplerOutput([ids[(step + i) % n] for i in range(rows)], [None] * rows)


class ZeroLayers:
    """The model's call with no work: zero hidden states. Its ``config`` stays the real
    model's (the runner reads the vocabulary size from it for a step that samples nothing)."""

    def __init__(self, config: ModelConfig, max_tokens: int) -> None:
        self.config = config
        self._hidden = torch.zeros(max_tokens, config.hidden_size)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: Any) -> torch.Tensor:
        return self._hidden[: input_ids.shape[0]]


def stub_device_work(engine: LLMEngine, token_ids: Sequence[int]) -> None:
    """Replace ``engine``'s forward, LM head and sampler (the plain loop's; not the overlapped
    loop's launcher, which holds its own)."""
    if overlap_mode(engine.config, engine.device) != "off":
        raise ValueError("the stub replaces the plain loop's parts: use --overlap-steps off")
    runner, scheduler = engine.runner, engine.config.scheduler
    runner.model = ZeroLayers(engine.model_config, scheduler.max_num_batched_tokens)  # type: ignore[assignment]
    logits = torch.zeros(scheduler.max_num_seqs, engine.model_config.vocab_size)
    runner.compute_logits = lambda rows: logits[: rows.shape[0]]  # type: ignore[assignment]
    engine.sampler = FixedSampler(token_ids)  # type: ignore[assignment]
