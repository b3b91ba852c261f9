"""The attention backend interface and the factory that picks one for a device."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal, NamedTuple

import torch
from torch import nn

from worker.attention.metadata import AttentionMetadata, KVCache
from worker.models.cpu_linear import LinearBackend, pack_linears

BackendName = Literal["auto", "torch", "cpu", "triton"]


class KernelCounts(NamedTuple):
    """What `AttentionBackend.install_kernels` changed in a model."""

    packed_linears: int  # nn.Linear swapped for oneDNN-packed `PackedLinear`s
    fused_modules: int  # norms, MLPs and attentions routed through fused layer kernels


class AttentionBackend(ABC):
    """Writes a step's new K/V into the paged cache, then attends over each sequence's context.

    Each method takes one layer's cache (`KVCache`). A backend also brings the layer kernels
    built with it (`install_kernels`): one build, one switch.
    """

    name: str = "abstract"
    # Whether a decode step through this backend can be captured in a CUDA graph: no host sync,
    # no host-side shapes read from the step's lengths, padding rows handled on the device.
    supports_cuda_graphs: bool = False
    # Whether the cache may hold another dtype than the model's queries (`CacheConfig.dtype`).
    mixed_kv_dtype: bool = True

    @abstractmethod
    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv: KVCache, meta: AttentionMetadata
    ) -> None:
        """Scatter ``key``/``value`` ``(num_tokens, Hkv, D)`` to ``meta.slot_mapping``."""

    @abstractmethod
    def decode(
        self, q: torch.Tensor, kv: KVCache, meta: AttentionMetadata, scale: float, out: torch.Tensor
    ) -> None:
        """Attention of the first ``meta.num_decodes`` sequences (one query each) into ``out``."""

    @abstractmethod
    def prefill(
        self, q: torch.Tensor, kv: KVCache, meta: AttentionMetadata, scale: float, out: torch.Tensor
    ) -> None:
        """Varlen causal attention of prefill chunks (``meta`` is a `prefill_part`) into ``out``."""

    def attend(
        self, q: torch.Tensor, kv: KVCache, meta: AttentionMetadata, scale: float
    ) -> torch.Tensor:
        """Attention output ``(num_tokens, Hq, D)`` for the packed queries ``q``."""
        d = meta.num_decodes
        out = torch.empty_like(q)
        if d:
            self.decode(q[:d], kv, meta, scale, out[:d])
        if d < meta.num_seqs:
            self.prefill(q[d:], kv, meta.prefill_part(), scale, out[d:])
        return out

    def forward(
        self,
        q: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv: KVCache,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        self.write_kv(key, value, kv, meta)
        return self.attend(q, kv, meta, scale)

    def install_kernels(self, model: nn.Module, linear_backend: LinearBackend) -> KernelCounts:
        """Route ``model``'s layers through the kernels that come with this backend. Here: pack
        its CPU projections for oneDNN (none on another device); no fused layer kernels."""
        return KernelCounts(pack_linears(model, linear_backend), 0)


def get_attention_backend(name: BackendName, device: torch.device) -> AttentionBackend:
    """``auto`` picks Triton on CUDA, elsewhere our C++ CPU kernels where they build (else
    torch); an explicit name overrides it, and ``cpu`` raises if the kernels cannot be built."""
    if name == "auto" and device.type == "cuda":
        name = "triton"
    if name in ("auto", "cpu"):
        from kernels import cpu_ops

        ops = cpu_ops.load()
        if ops is not None:
            from worker.attention.cpu_backend import CpuAttentionBackend

            return CpuAttentionBackend(ops)
        if name == "cpu":
            raise RuntimeError(f"CPU attention kernels unavailable: {cpu_ops.unavailable_reason()}")
        name = "torch"
    if name == "torch":
        from worker.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "triton":
        from worker.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r}; expected auto, torch, cpu or triton")
