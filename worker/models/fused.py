"""Which modules take fused layer kernels, and how a set of kernels is attached to them.

`RMSNorm`, `SwiGLU` and `Attention` each keep their torch code and hold a kernel module in a class
attribute that is None unless set on an instance: ``cpu_ops`` (`use_cpu_kernels`, the C++ build)
or ``gpu_ops`` (`use_gpu_kernels`, Triton).
"""

from __future__ import annotations

from types import ModuleType
from typing import Literal

from torch import nn

from worker.models.layers import RMSNorm, SwiGLU
from worker.models.llama import Attention

FUSED_MODULES = (RMSNorm, SwiGLU, Attention)


def attach_ops(model: nn.Module, slot: Literal["cpu_ops", "gpu_ops"], ops: ModuleType) -> int:
    """Set ``ops`` as ``slot`` on every fusable module of ``model``; how many took it."""
    count = 0
    for module in model.modules():
        if isinstance(module, FUSED_MODULES):
            setattr(module, slot, ops)
            count += 1
    return count
