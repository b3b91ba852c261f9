# mypy: disallow-untyped-defs=False
# (@triton.jit bodies use tl.constexpr annotations mypy cannot type.)
"""Quantized linears on CUDA: 8-bit weights (int8 or FP8 e4m3, a scale a row).

- `w8_linear`: ``x @ (scale[:, None] * q).T + bias`` with ``q`` int8 (kernels/quant_reference.py's
  `quantize_int8`) or e4m3 (`quantize_fp8`) codes ``(N, K)`` and ``x`` bf16/fp16/fp32. Each
  program computes a ``BLOCK_M x BLOCK_N`` tile of the output: the code tile is loaded (1 byte a
  weight where bf16 streams 2), widened to the activations' dtype in registers, multiplied on the
  tensor cores with fp32 accumulation, and scaled per output channel once at the end. ``x`` stays
  exact. Its tiles depend on the rows (`TILES`). `int8_linear` is it for int8 codes.
- `fp8_linear`: e4m3 weights with activations quantized to e4m3 per row on the fly, through
  ``torch._scaled_mm`` (row-wise scales: sm_89+ on CUDA): FP8 arithmetic, for many rows (prefill).
  `fp8_linear_reference` spells out the same math in float32, which the CPU tests hold it to.

On an H100 (2026-12-06, BENCHMARKS.md) `fp8_linear` at decode sizes was slower than bf16: its
activation quantization is five elementwise kernels a projection, and cuBLAS chose 128x128 tiles
for one row. Hence `WEIGHT_ONLY_MAX_ROWS`: up to that many rows both formats take `w8_linear`.
Tested under ``TRITON_INTERPRET=1`` and compiled for sm_90 (kernels/compile_check.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.triton_common import FLOAT_DTYPES, check_device, dot_flags

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3fn value
CODE_DTYPES = (torch.int8, FP8)
# Rows up to which int8 and FP8 projections take `w8_linear`: every CUDA graph size (decode
# steps, 512 at most). Beyond (prefill chunks), int8 widens its weight for cuBLAS and FP8 runs
# `fp8_linear`: there the arithmetic, not the weight's bytes, sets the time.
WEIGHT_ONLY_MAX_ROWS = 512


@dataclass(frozen=True)
class Tiles:
    """One launch shape of `_w8_linear_kernel`: the output tile, the K step, warps, stages."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


# Launch shapes by the most rows they serve (tl.dot's smallest tile side is 16), each the one
# with the least time summed over Llama-3.2-1B's four projections on an H100 (ops/bench/
# quant_gpu.py, 13 candidates, 2026-12-06; docs/bench/h200/2026-12-06-h100-quant/), in µs a layer
# against bf16's cuBLAS: 45.2 / 53.4 at 1 row, 44.9 / 55.2 at 16, 52.4 / 55.7 at 32, 72.4 / 57.6
# at 64, 103.6 / 60.6 at 128, 142.7 / 68.2 at 256, 213.0 / 103.8 at 512. So 8-bit weights pay
# up to 32 rows; past 64 these tiles lose to bf16 (a better GEMM is open work). The other ways
# do no better there: widening the whole weight per call (int8: a 256-row step 8.71 ms against
# bf16's 3.24, the lease's first call) or FP8's _scaled_mm (134-164 µs at 64-256 rows, 216 at 512).
TILES: tuple[tuple[int, Tiles], ...] = (
    (32, Tiles(16, 32, 512)),
    (64, Tiles(32, 32, 256)),
    (256, Tiles(64, 64, 128)),
    (1 << 30, Tiles(64, 128, 64)),
)


def tiles_for(m: int) -> Tiles:
    return next(t for rows, t in TILES if m <= rows)


@triton.jit
def _w8_linear_kernel(
    x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr,
    M, N, K,
    stride_xm, stride_om,
    HAS_BIAS: tl.constexpr,
    UPCAST: tl.constexpr,
    E4M3: tl.constexpr,
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
        if E4M3:  # the codes come as int8 bytes: masked ones 0, which is e4m3's zero too
            w = w.to(tl.float8e4nv, bitcast=True)
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


def w8_linear(
    x: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    tiles: Tiles | None = None,
) -> torch.Tensor:
    """``x (M, K) @ (scale[:, None] * q).T (+ bias)`` in ``x``'s dtype, ``q`` int8 or e4m3
    codes ``(N, K)`` widened in registers (weight-only: ``x`` is never rounded to 8 bits);
    ``tiles`` overrides `tiles_for` (benchmarks)."""
    if x.dim() != 2 or x.dtype not in FLOAT_DTYPES or x.stride(1) != 1:
        raise ValueError(f"x must be 2-D {FLOAT_DTYPES} with contiguous rows, got {x.dtype}")
    if q.dtype not in CODE_DTYPES or q.dim() != 2 or not q.is_contiguous():
        raise ValueError(f"q must be contiguous int8 or e4m3 (N, K), got {q.dtype}")
    if q.shape[1] != x.shape[1]:
        raise ValueError(f"q must be (N, {x.shape[1]}), got {tuple(q.shape)}")
    n = q.shape[0]
    if scale.shape != (n,) or scale.dtype != torch.float32:
        raise ValueError(f"scale must be float32 ({n},), got {scale.dtype} {tuple(scale.shape)}")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias must hold {n} values, got {tuple(bias.shape)}")
    tensors = (x, q, scale) if bias is None else (x, q, scale, bias)
    check_device(_w8_linear_kernel, *tensors)
    m, k = x.shape
    t = tiles or tiles_for(m)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    upcast = dot_flags(x.dtype, x.device)[0] or x.dtype == torch.float32
    grid = (triton.cdiv(m, t.block_m), triton.cdiv(n, t.block_n))
    _w8_linear_kernel[grid](
        x, q.view(torch.int8), scale, scale if bias is None else bias, out,
        m, n, k, x.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, UPCAST=upcast, E4M3=q.dtype == FP8,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
        num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip
    return out


def int8_linear(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x (M, K) @ (scale[:, None] * q).T (+ bias)`` in ``x``'s dtype, ``q`` int8."""
    if q.dtype != torch.int8:
        raise ValueError(f"q must be contiguous int8 (N, {x.shape[-1]}), got {q.dtype}")
    return w8_linear(x, q, scale, bias)


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
    """Row-wise scaled FP8 GEMMs: CUDA sm_89+ (Ada, Hopper), or a CPU build whose ``_scaled_mm``
    takes row-wise scales (2.13's does; 2.11's takes per-tensor scales only)."""
    if not hasattr(torch, "_scaled_mm"):
        return False
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 9)
    return device.type == "cpu" and _cpu_rowwise_scaled_mm()


@functools.cache
def _cpu_rowwise_scaled_mm() -> bool:
    a = torch.zeros(2, 16, dtype=FP8)
    try:
        torch._scaled_mm(a, a.t(), scale_a=torch.ones(2, 1), scale_b=torch.ones(1, 2))
    except RuntimeError:
        return False
    return True


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
