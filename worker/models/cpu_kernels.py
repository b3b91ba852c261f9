"""Route a float32 CPU model's per-token operations through our C++ kernels.

`kernels/cpu_layer_ops.cpp` does RMSNorm with its residual add, SiLU-and-multiply and rotary
embedding each in one call and one pass, where torch takes 2-8 calls with a new tensor each. At
decode sizes the calls cost more than their arithmetic, 30 layers deep.

The modules keep their torch code: `cpu_ops` is a class attribute, None unless set here on an
instance, and each module falls back to torch for inputs the kernels do not take (other dtypes,
non-contiguous rows).
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from worker.models.fused import attach_ops

# The K/V cache dtypes `kernels/cpu_paged_attention.cpp` reads and writes (bf16 widened to
# float32 as it is read): the `cpu` backend and the decode stack take these, others torch's path.
KERNEL_CACHE_DTYPES = (torch.float32, torch.bfloat16)


def use_cpu_kernels(model: nn.Module, ops: ModuleType | None) -> int:
    """Attach ``ops`` to every fusable module of a float32 CPU ``model``; how many took them.

    Nothing is attached when ``ops`` is None (the kernels did not build, or another attention
    backend was chosen) or the model is not float32 on the CPU.
    """
    if ops is None:
        return 0
    params = list(model.parameters())
    if not params or params[0].device.type != "cpu" or params[0].dtype != torch.float32:
        return 0
    return attach_ops(model, "cpu_ops", ops)
