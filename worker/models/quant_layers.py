"""The modules over a `QuantWeight`: `QuantLinear` replaces an `nn.Linear`, `QuantEmbedding` an
`nn.Embedding`; a tied LM head and its embedding share one weight."""

from __future__ import annotations

import torch
from torch import nn

from worker.models.quant import QuantWeight


class QuantLinear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` a `QuantWeight` (shared with a tied embedding)."""

    def __init__(self, weight: QuantWeight, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.qweight = weight
        self.in_features, self.out_features = weight.in_features, weight.out_features
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.qweight
        ops = w.ops
        if (
            ops is not None
            and x.dim() == 2
            and x.dtype == torch.float32
            and x.shape[0] < w.gemm_min_rows
            and x.shape[0] < w.bf16_min_rows
            and x.stride(1) == 1
        ):
            # A decode step's (rows, k) float32, straight to the kernel: no reshape, no cast and
            # no second method call; 5.7 -> 2.5 us of Python a call (1 thread), 121 calls a
            # token on SmolLM2-135M.
            if w.type_id is None:
                return ops.int8_linear(x, w.data, w.scale, self.bias)
            if x.shape[0] <= w.a8_max_rows:
                return ops.gguf_linear_q8(x, w.data, w.type_id, self.bias, w.panels)
            if w.kmajor:
                return ops.gguf_linear_kmajor(x, w.data, w.type_id, self.bias)
            return ops.gguf_linear(x, w.data, w.type_id, self.bias)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x2.dtype != torch.float32 or x2.stride(-1) != 1:
            x2 = x2.float().contiguous()
        out = self.qweight.linear(x2, self.bias)
        return out.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"format={self.qweight.format_name}, bias={self.bias is not None}"
        )


class QuantEmbedding(nn.Module):
    """Token embeddings looked up in a `QuantWeight` ``(vocab, hidden)``, dequantized per row."""

    def __init__(self, weight: QuantWeight, dtype: torch.dtype) -> None:
        super().__init__()
        self.qweight = weight
        self.dtype = dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = self.qweight.rows(input_ids)
        return rows.reshape(*input_ids.shape, -1).to(self.dtype)
