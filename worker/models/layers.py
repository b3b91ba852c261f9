"""Building blocks of the Llama family: RMSNorm, rotary embedding, SwiGLU MLP."""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from worker.models.config import RopeConfig


class RMSNorm(nn.Module):
    # Our C++ kernels (`kernels/cpu_ops.py`) where `use_cpu_kernels` attached them, else None.
    cpu_ops: ModuleType | None = None
    # Our Triton kernels (`kernels/triton_layer_ops.py`) where `use_gpu_kernels` attached them.
    gpu_ops: ModuleType | None = None

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def add_forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(x + residual), x + residual)``; the C++ kernel writes both in place (one pass
        over the row instead of an add, a norm and two new tensors)."""
        if self.cpu_ops is not None and _fusable(x) and _fusable(residual):
            self.cpu_ops.add_rms_norm_(x, residual, self.weight, self.eps)
            return x, residual
        if self.gpu_ops is not None:
            return self.gpu_ops.add_rms_norm_(x, residual, self.weight, self.eps)
        residual = x + residual
        return self(residual), residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gpu_ops is not None:  # the arithmetic below in one launch
            return self.gpu_ops.rms_norm(x, self.weight, self.eps)
        # Normalise in float32 whatever the activation dtype: bf16's 8-bit mantissa loses the
        # variance of 576+ channels otherwise. Same order of operations as HF for fp32 parity.
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # One fused call, bit-identical to the steps below in fp32 and 2-7x faster on CPU
            # for 1-512 rows (6 elementwise ops otherwise, twice per layer).
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def _fusable(x: torch.Tensor) -> bool:
    """What `add_rms_norm_` takes; anything else keeps the torch path instead of raising."""
    return x.dtype == torch.float32 and x.is_contiguous()


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE with a precomputed cos/sin table indexed by absolute position."""

    cos: torch.Tensor  # (max_position, D/2) float32
    sin: torch.Tensor

    def __init__(self, head_size: int, max_position: int, rope: RopeConfig) -> None:
        super().__init__()
        inv_freq = rope.inv_freq(head_size)
        positions = torch.arange(max_position, dtype=torch.int64).float()
        freqs = positions[:, None] * inv_freq[None, :]  # (P, D/2)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``(T, 1, D/2)`` of a step's positions, looked up once for all layers."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q`` ``(T, Hq, D)`` and ``k`` ``(T, Hkv, D)`` by `RotaryEmbedding.lookup`'s table."""
    return rotate(q, cos_sin), rotate(k, cos_sin)


def rotate(x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotate every head of ``x`` ``(T, H, D)`` (any strides) into a new contiguous tensor."""
    cos, sin = cos_sin
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with gate and up fused into one matmul."""

    cpu_ops: ModuleType | None = None  # as `RMSNorm.cpu_ops`
    gpu_ops: ModuleType | None = None  # as `RMSNorm.gpu_ops`

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.cpu_ops is not None and gate_up.dtype == torch.float32:
            return self.down_proj(self.cpu_ops.silu_and_mul(gate_up))
        if self.gpu_ops is not None:
            return self.down_proj(self.gpu_ops.silu_and_mul(gate_up))
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)
