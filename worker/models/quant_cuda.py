"""``--quantization int8`` on CUDA: per-channel symmetric int8 weights, one byte a weight where
bf16 streams two, through kernels/triton_quant.py's Triton GEMM.

A decode step's projections are bound by reading their weights (Llama-3.2-1B: 2.15 GB of bf16
a step, 0.73 ms at an H100's measured 2.96 TB/s), so halving the bytes is the point at few rows.
Up to `WEIGHT_ONLY_MAX_ROWS` rows (every CUDA graph size) a call takes the Triton kernel, whose
tiles grow with the rows; beyond (prefill chunks) it widens the weight to the activations'
dtype, transiently, for cuBLAS: arithmetic sets the time there.

The LM head stays float, as FP8 checkpoints keep theirs (quant_fp8.py): its table is also the
embedding's where tied, and the last layer's logits are the ones a quantization error reaches
unsmoothed. On the CPU, int8 goes through worker/models/quant.py's C++ kernels instead.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels import quant_reference as qr
from kernels.triton_quant import WEIGHT_ONLY_MAX_ROWS, w8_linear
from worker.models.module_walk import named_linears

KEEP_FLOAT = ("lm_head",)  # module names whose weights stay float


class Int8Linear(nn.Module):
    """``y = x @ (scale[:, None] * q).T + b`` with ``q`` int8 ``(N, K)`` codes, in ``x``'s dtype."""

    q: torch.Tensor
    scale: torch.Tensor

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        if q.dtype != torch.int8 or q.dim() != 2 or scale.shape != (q.shape[0],):
            raise ValueError("Int8Linear takes int8 (N, K) codes and (N,) scales")
        self.register_buffer("q", q.contiguous(), persistent=False)
        self.register_buffer("scale", scale.float(), persistent=False)
        self.out_features, self.in_features = q.shape
        self.bias = None if bias is None else nn.Parameter(bias.detach(), False)

    @classmethod
    def of(cls, linear: nn.Linear) -> Int8Linear:
        """``linear``'s weight rounded to int8 per output channel, on its device."""
        q, scale = qr.quantize_int8(linear.weight)
        device = linear.weight.device
        return cls(q.to(device), scale.to(device), linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        if x2.shape[0] <= WEIGHT_ONLY_MAX_ROWS:
            out = w8_linear(x2.contiguous(), self.q, self.scale, self.bias)
        else:
            weight = self.q.to(x.dtype) * self.scale.to(x.dtype)[:, None]
            out = nn.functional.linear(x2, weight, self.bias)
        return out.reshape(*x.shape[:-1], self.out_features)

    def nbytes(self) -> int:
        return self.q.numel() + self.scale.numel() * self.scale.element_size()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format=int8"


def to_int8(model: nn.Module) -> int:
    """Swap every `nn.Linear` of ``model`` but `KEEP_FLOAT`'s for an `Int8Linear`; how many."""
    swapped = 0
    for name, (parent, attr, linear) in named_linears(model).items():
        if name not in KEEP_FLOAT:
            setattr(parent, attr, Int8Linear.of(linear))
            swapped += 1
    return swapped
