"""The step's logits written into one buffer kept across steps, where a fresh one costs most.

glibc serves an allocation above its mmap threshold (which grows to at most 32 MiB) with a
fresh mapping and returns it with munmap when freed. The logits of 256 rows of a 49,152-token
vocabulary in fp32 are 50 MB: every step page-faulted a new tensor in while the LM head wrote
it, and unmapped it at the end of the step (8-12 ms a step on our 2 cores). Here the LM head
writes into a buffer allocated once, with ``torch.mm(hidden, W.T, out=...)`` (the kernel
``F.linear`` runs, as Hugging Face's model does).

Only where the logits are that large: below 32 MiB glibc reuses freed heap memory, and the LM
head runs as the model says (oneDNN's packed GEMM, which at 16-64 rows of a 576-wide model
took 16-36 ms where ``torch.mm`` took 24-52). At 256 rows of that model the two took 118 and
112 ms of CPU, allocation and free included; their logits differ in the last bits (``torch.mm``
equals ``F.linear``). Only for the stock ``lm_head(hidden).float()`` of an fp32 CPU model whose
head keeps a plain weight and no bias; every other model computes its own logits.
"""

from __future__ import annotations

import weakref
from typing import Protocol

import torch

from worker.models.llama import LlamaForCausalLM

MIN_BYTES = 32 << 20  # glibc's largest dynamic mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX)
_UNRESOLVED = object()


class LogitsModel(Protocol):
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


class LogitsBuffer:
    """``model.compute_logits(hidden)``, written into a kept buffer where that pays.

    The tensor returned is valid until the next call; if the caller still holds it then, the
    next call writes a new buffer instead of overwriting the held one.
    """

    def __init__(self, model: LogitsModel) -> None:
        self.model = model
        self._weight: object = _UNRESOLVED  # resolved at the first call: after kernels swap
        self._buffer: torch.Tensor | None = None
        self._lent: weakref.ref[torch.Tensor] | None = None

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self._head_weight()
        rows = hidden.shape[0]
        if weight is None or hidden.dtype != torch.float32 or hidden.device.type != "cpu":
            return self.model.compute_logits(hidden)
        vocab = weight.shape[0]
        if rows * vocab * 4 < MIN_BYTES:
            return self.model.compute_logits(hidden)
        buffer = self._buffer
        held = self._lent is not None and self._lent() is not None
        if buffer is None or buffer.shape[0] < rows or held:
            buffer = self._buffer = torch.empty((rows, vocab), dtype=torch.float32)
        out = buffer[:rows]
        torch.mm(hidden, weight.t(), out=out)
        self._lent = weakref.ref(out)
        return out

    def _head_weight(self) -> torch.Tensor | None:
        if self._weight is _UNRESOLVED:
            self._weight = _plain_head_weight(self.model)
        weight = self._weight
        return weight if isinstance(weight, torch.Tensor) else None


def _plain_head_weight(model: LogitsModel) -> torch.Tensor | None:
    """The LM head's ``(vocab, hidden)`` fp32 CPU weight, if its logits are ``hidden @ W.T``."""
    if type(model).compute_logits is not LlamaForCausalLM.compute_logits:
        return None
    head = getattr(model, "lm_head", None)
    weight = getattr(head, "weight", None)
    if getattr(head, "bias", None) is not None or not isinstance(weight, torch.Tensor):
        return None
    if weight.dim() != 2 or weight.dtype != torch.float32 or weight.device.type != "cpu":
        return None
    return weight.detach()
