"""Linear layers with oneDNN-prepacked weights: the CPU path for every projection.

`torch.nn.functional.linear` on CPU re-reads a row-major weight and repacks it per call. At decode
batch sizes the weights do not stay in cache across a 30-layer step, so that is most of a step.
oneDNN's reordered ("blocked") weight layout is packed once at load time. On our 2-core AVX2
development machine, SmolLM2-135M's 121 projections per step took 47 ms instead of 80 ms at 8
rows and 51 ms instead of 96 ms at 16 rows (fp32, weights cycled through DRAM as in a real step;
`python ops/bench/cpu_linear.py`). vLLM's CPU build packs its weights the same way.

The packed weight is an opaque oneDNN tensor, so it is held as a plain attribute: the module
system (``state_dict``, ``.to()``, ``parameters()``) never sees it. The original is dropped
unless another module shares it (a tied LM head keeps the embedding table), or unless our C++
kernels are given (``skinny_ops``): then steps of at most `SKINNY_MAX_ROWS` rows go through
`skinny_linear` (kernels/cpu_linear.cpp) on the plain weight, which streams it once where
oneDNN's blocked GEMM and MKL's gemv do not. That keeps both copies, twice the projection
weights' memory (+425 MB for SmolLM2-135M in fp32); ``linear_backend="onednn"`` keeps one.
"""

from __future__ import annotations

from types import ModuleType
from typing import Literal

import torch
from torch import nn

from worker.models.module_walk import named_linears

LinearBackend = Literal["auto", "torch", "onednn"]

# Rows up to which `skinny_linear` beats oneDNN's packed GEMM. `python ops/bench/cpu_linear.py`
# on 2 AVX2 cores (the 120 projections of a SmolLM2-135M step, ms, oneDNN / skinny): 1 row
# 45.3 / 36.3, 4 rows 50.0 / 38.6, 8 rows 60.3 / 53.8, 16 rows 73.4 / 81.3. On an AVX-512 Xeon
# (1 thread, CPU ms, after the kernel's tree sums and prefetch): 1 row 37.9 / 34.0, 4 rows
# 41.5 / 37.1, 8 rows 46.2 / 43.3, 16 rows 57.1 / 60.5.
SKINNY_MAX_ROWS = 8


class PackedLinear(nn.Module):
    """``y = x @ W.T + b`` for a CPU weight reordered by oneDNN once, at construction."""

    def __init__(self, linear: nn.Linear, skinny_ops: ModuleType | None = None) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach()
        # None: no batch-size hint. A hint of 1, 16 or 64 measured within noise of it for the
        # 1-512 row mixes a step sees, and one packing must serve them all.
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        self.bias = None if linear.bias is None else linear.bias.detach().clone()
        fp32 = weight.dtype == torch.float32
        self.skinny_ops = skinny_ops if fp32 else None
        self.weight = weight.contiguous() if self.skinny_ops is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            self.skinny_ops is not None
            and x.dim() == 2
            and x.shape[0] <= SKINNY_MAX_ROWS
            and x.stride(1) == 1
            and x.dtype == torch.float32
        ):
            return self.skinny_ops.skinny_linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={bias}"


def onednn_supports(dtype: torch.dtype) -> bool:
    """Whether this CPU and torch build can pack and run a ``dtype`` weight with oneDNN.

    fp32 needs only oneDNN; bf16 needs AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT, which an AVX2-only
    CPU lacks: the reorder raises there, and we keep torch's path.
    """
    if not torch.backends.mkldnn.is_available():
        return False
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    try:
        probe = nn.Linear(16, 16, bias=True, dtype=dtype)
        out = PackedLinear(probe)(torch.ones(2, 16, dtype=dtype))
    except RuntimeError:
        return False
    return bool(
        torch.allclose(out.float(), probe(torch.ones(2, 16, dtype=dtype)).float(), atol=1e-2)
    )


def pack_linears(
    model: nn.Module, backend: LinearBackend = "auto", skinny_ops: ModuleType | None = None
) -> int:
    """Swap every CPU `nn.Linear` in ``model`` for a `PackedLinear`; the number swapped.

    ``auto`` packs where oneDNN supports the weights' dtype and leaves the model as it is
    otherwise, and routes few-row steps to ``skinny_ops`` when given; ``onednn`` raises where
    oneDNN cannot pack, and never uses ``skinny_ops``; ``torch`` never packs.
    """
    if backend == "torch":
        return 0
    linears = [
        (parent, name, child)
        for parent, name, child in named_linears(model).values()
        if child.weight.device.type == "cpu"
    ]
    if not linears:
        return 0
    dtype = linears[0][2].weight.dtype
    if not onednn_supports(dtype):
        if backend == "onednn":
            raise RuntimeError(f"oneDNN cannot pack {dtype} linear weights on this CPU")
        return 0
    skinny = skinny_ops if backend == "auto" else None
    for parent, name, child in linears:
        setattr(parent, name, PackedLinear(child, skinny))
    return len(linears)
