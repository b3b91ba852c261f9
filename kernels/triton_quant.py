# mypy: disallow-untyped-defs=False
# (@triton.jit bodies use tl.constexpr annotations mypy cannot type.)
"""Weight-only quantized linears on CUDA: int8 through a Triton GEMM, FP8 through _scaled_mm.

- `int8_linear`: ``x @ (scale[:, None] * q).T + bias`` with ``q`` per-channel symmetric int8
  ``(N, K)`` (kernels/quant_reference.py's `quantize_int8`) and ``x`` bf16/fp16/fp32. Each
  program computes a ``BLOCK_M x BLOCK_N`` tile of the output: the int8 tile is loaded (1 byte a
  weight where bf16 streams 2), widened to the activations' dtype in registers, multiplied on the
  tensor cores with fp32 accumulation, and scaled per output channel once at the end.
- `fp8_linear`: e4m3 weights with per-channel scales (`quantize_fp8`), activations quantized to
  e4m3 per row on the fly, through ``torch._scaled_mm`` (row-wise scales: sm_89+ on CUDA; torch's
  CPU build has it too). `fp8_linear_reference` spells out the same math in float32, which is
  what the CPU tests hold it to.

Written and tested under ``TRITON_INTERPRET=1`` and compiled for sm_90 (kernels/compile_check.py);
not yet measured on a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_common import FLOAT_DTYPES, check_device, dot_flags

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3fn value
# 16-row tiles: decode batches are 1-64 rows and tl.dot's smallest M is 16. 64 x 64 int8 weight
# tiles are 4 KiB, two pipeline stages well inside shared memory on every sm_80+ part.
BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 64


@triton.jit
def _int8_linear_kernel(
    x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr,
    M, N, K,
    stride_xm, stride_om,
    HAS_BIAS: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_ptr + rows[:, None] * stride_xm + ks[None, :],
            mask=(rows[:, None] < M) & (ks[None, :] < K),
            other=0.0,
        )
        w = tl.load(
            w_ptr + cols[None, :] * K + ks[:, None],  # (BLOCK_K, BLOCK_N): W.T's tile
            mask=(cols[None, :] < N) & (ks[:, None] < K),
            other=0,
        )
        if UPCAST:  # the interpreter's bf16 dot is wrong (triton_common.dot_flags)
            acc += tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(x, w.to(x.dtype))
    scale = tl.load(scale_ptr + cols, mask=cols < N, other=0.0)
    acc = acc * scale[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rows[:, None] * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def int8_linear(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x (M, K) @ (scale[:, None] * q).T (+ bias)`` in ``x``'s dtype."""
    if x.dim() != 2 or x.dtype not in FLOAT_DTYPES or x.stride(1) != 1:
        raise ValueError(f"x must be 2-D {FLOAT_DTYPES} with contiguous rows, got {x.dtype}")
    if q.dtype != torch.int8 or q.dim() != 2 or not q.is_contiguous() or q.shape[1] != x.shape[1]:
        raise ValueError(f"q must be contiguous int8 (N, {x.shape[1]}), got {tuple(q.shape)}")
    n = q.shape[0]
    if scale.shape != (n,) or scale.dtype != torch.float32:
        raise ValueError(f"scale must be float32 ({n},), got {scale.dtype} {tuple(scale.shape)}")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias must hold {n} values, got {tuple(bias.shape)}")
    tensors = (x, q, scale) if bias is None else (x, q, scale, bias)
    check_device(_int8_linear_kernel, *tensors)
    m, k = x.shape
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    upcast = dot_flags(x.dtype, x.device)[0] or x.dtype == torch.float32
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
    _int8_linear_kernel[grid](
        x, q, scale, scale if bias is None else bias, out,
        m, n, k, x.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, UPCAST=upcast,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
    )  # fmt: skip
    return out


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel e4m3: ``(w_fp8 (N, K), scale float32 (N,))``, ``w ~ scale * w_fp8``."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1).clamp(min=1e-12)
    scale = amax / FP8_MAX
    return (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def _quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations per row to e4m3: ``(x_fp8 (M, K), scale float32 (M, 1))``."""
    xf = x.float()
    scale = (xf.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=1e-12)
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def fp8_supported(device: torch.device) -> bool:
    """Row-wise scaled FP8 GEMMs: CUDA sm_89+ (Ada, Hopper), or torch's CPU kernel."""
    if not hasattr(torch, "_scaled_mm"):
        return False
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 9)
    return device.type == "cpu"


def fp8_linear(
    x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ (w_scale[:, None] * w_fp8).T (+ bias)`` in ``x``'s dtype, activations quantized to
    e4m3 per row; `fp8_linear_reference` where ``_scaled_mm`` cannot run."""
    if not fp8_supported(x.device):
        return fp8_linear_reference(x, w_fp8, w_scale, bias)
    x_fp8, x_scale = _quantize_rows(x)
    out = torch._scaled_mm(
        x_fp8,
        w_fp8.t(),  # column-major (K, N), as _scaled_mm requires of its second operand
        scale_a=x_scale,
        scale_b=w_scale.float()[None, :],
        bias=None if bias is None else bias.to(x.dtype),
        out_dtype=x.dtype,
    )
    return out


def fp8_linear_reference(
    x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The math of `fp8_linear` in float32: both operands rounded to e4m3 and scaled back."""
    x_fp8, x_scale = _quantize_rows(x)
    out = (x_fp8.float() * x_scale) @ (w_fp8.float() * w_scale.float()[:, None]).T
    return (out if bias is None else out + bias.float()).to(x.dtype)
