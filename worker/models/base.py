"""The contract between a decoder, its loader and the model runner.

A decoder runs one packed step: all scheduled tokens of all sequences concatenated, shape
``(T,)``, no padding. Attention finds each sequence's past in the paged KV cache through the
`StepContext`; everything else is per-token. The loader fills a `CausalLM` from a checkpoint by
asking it where each checkpoint tensor goes (`weight_target`); the runner only calls `forward`
and `compute_logits` and reads `config` and `dtype`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from worker.attention import AttentionBackend, AttentionMetadata, KVCache
from worker.models.config import ModelConfig


@dataclass(frozen=True)
class StepContext:
    """What attention needs for one step besides activations: metadata, backend, caches."""

    meta: AttentionMetadata
    backend: AttentionBackend
    kv_caches: Sequence[KVCache]  # one per layer


class WeightTarget(NamedTuple):
    """Where one checkpoint tensor goes: our parameter, rows ``[start, end)`` of it (end -1:
    the whole parameter). Fused projections (q/k/v, gate/up) take several tensors' rows."""

    name: str
    start: int = 0
    end: int = -1


class CausalLM(nn.Module, ABC):
    """A decoder + LM head over a packed step; what every registered architecture implements."""

    config: ModelConfig

    @abstractmethod
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: StepContext
    ) -> torch.Tensor:
        """``input_ids``/``positions`` ``(T,)`` -> final hidden states ``(T, hidden)``."""

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``(R, vocab)`` in float32 for the rows of ``hidden`` that sample this step."""

    @abstractmethod
    def weight_target(self, checkpoint_name: str) -> WeightTarget | None:
        """Where a Hugging Face checkpoint tensor goes; None: not ours to load (tied, computed)."""

    def init_buffers(self) -> None:
        """Recompute buffers that are not weights (a model built on the meta device and moved
        with ``to_empty`` holds garbage in them). Nothing to do unless a model has some."""

    def tie_weights(self) -> None:
        """Share tensors the checkpoint stores once (a tied LM head); after ``to_empty``."""

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype: the activations' and the KV cache's."""
        return next(self.parameters()).dtype
