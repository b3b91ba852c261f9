"""Route a CUDA model's per-token operations through our Triton kernels.

`kernels/triton_layer_ops.py` does RMSNorm with its residual add, SiLU-and-multiply and rotary
embedding each in one launch, where torch takes 3-8 kernels and a new tensor each: the GPU twin
of `use_cpu_kernels`. The modules keep their torch code: ``gpu_ops`` is a class attribute, None
unless set here on an instance.

Unlike the C++ path, the kernels take every dtype a model runs in (bf16, fp16, fp32) and strided
rows, so a routed module never falls back to torch; the launchers raise on anything else.
"""

from __future__ import annotations

from torch import nn

from worker.models.fused import attach_ops


def use_gpu_kernels(model: nn.Module, *, allow_interpreter: bool = False) -> int:
    """Attach the Triton layer kernels to every fusable module of a CUDA ``model``; how many took
    them.

    Nothing is attached to a model off CUDA, unless ``allow_interpreter`` and the kernels run
    under Triton's interpreter (``TRITON_INTERPRET=1``, the CPU tests): the interpreter is some
    thousand times slower than torch, so it is never picked up by accident.
    """
    params = list(model.parameters())
    if not params:
        return 0
    device, dtype = params[0].device, params[0].dtype
    if any(p.device != device or p.dtype != dtype for p in params):
        return 0  # the launchers take one device and the weights in the activations' dtype
    # Imported here: it imports Triton, which a CPU engine never needs.
    from kernels import triton_layer_ops as ops
    from kernels.triton_common import FLOAT_DTYPES, is_interpreted

    interpreted = allow_interpreter and is_interpreted(ops._rms_norm_kernel)
    if dtype not in FLOAT_DTYPES or not (device.type == "cuda" or interpreted):
        return 0
    return attach_ops(model, "gpu_ops", ops)
