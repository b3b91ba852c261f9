# mypy: disallow-untyped-defs=False
# (@triton.jit bodies use tl.constexpr annotations mypy cannot type.)
"""A decoder layer's per-token operations for the GPU: the Triton twins of `cpu_layer_ops.cpp`.

- `add_rms_norm_`: ``residual += x`` then ``x = rmsnorm(residual) * weight``, both in place.
- `rms_norm`: the same norm without the add, into a new tensor (first layer, q/k norms).
- `rotary_`: rotate-half RoPE on q and k in place, one launch for both (`kernels.triton_rotary`).
- `silu_and_mul`: ``silu(gate) * up`` of a fused gate/up projection.

Each is one pass over its rows where torch takes 3-8 kernels and as many temporaries. The
arithmetic, including each point where a result is rounded to the activation dtype, is that of
the model's torch code (`worker.models.layers`, restated in `kernels.reference`): a routed fp16
model gives bit-identical logits under the interpreter. Left apart: the order of the sum of
squares, and on a GPU the approximate rsqrt and exp.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_common import FLOAT_DTYPES, check_device
from kernels.triton_rotary import rotary_

__all__ = ["add_rms_norm_", "rms_norm", "rotary_", "silu_and_mul"]

# One program holds a whole row in registers: 16384 (Llama-3-405B's hidden size) is 32 fp32
# values per thread at 16 warps. Wider rows would need a looped two-pass kernel.
MAX_NORM_WIDTH = 16384
# Elements per norm program for narrower rows: several rows share a program (see `_launch_norm`).
NORM_TILE = 4096
# Elements per SiLU-and-multiply program: 4 warps x 32 lanes x 8 = one 16-byte bf16 vector each.
SILU_BLOCK = 1024


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    stride_x_tok,
    stride_x_head,
    stride_r_tok,
    stride_o_tok,
    stride_o_head,
    num_rows,
    num_heads,
    eps,
    WIDTH: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    # A (BLOCK_R, BLOCK) tile of rows, each normalised on its own. Row r is head r % num_heads
    # of token r // num_heads: a hidden row (num_heads = 1) or one q/k head of a fused QKV row.
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    tok, head = rows // num_heads, rows % num_heads
    offs = tl.arange(0, BLOCK)
    mask = (rows[:, None] < num_rows) & (offs[None, :] < WIDTH)
    dtype = out_ptr.dtype.element_ty
    x_ptrs = x_ptr + (tok * stride_x_tok + head * stride_x_head)[:, None] + offs[None, :]
    x = tl.load(x_ptrs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # The sum is rounded to the activation dtype before it is normalised, as torch's
        # ``x + residual`` is: the residual stream keeps only what the next layer will read.
        r_ptrs = residual_ptr + (tok * stride_r_tok)[:, None] + offs[None, :]
        r = tl.load(r_ptrs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)
        tl.store(r_ptrs, x, mask=mask)
    x = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=1) / WIDTH + eps)
    # Normalised in fp32, rounded to the activation dtype, then scaled by the weight and rounded
    # again: the model's ``weight * x32.to(dtype)`` (both roundings are no-ops in fp32).
    normed = (x * inv_rms[:, None]).to(dtype).to(tl.float32)
    w = tl.load(weight_ptr + offs, mask=offs < WIDTH, other=0.0).to(tl.float32)
    o_ptrs = out_ptr + (tok * stride_o_tok + head * stride_o_head)[:, None] + offs[None, :]
    tl.store(o_ptrs, (normed * w[None, :]).to(dtype), mask=mask)


def _check_norm(x: torch.Tensor, weight: torch.Tensor, name: str) -> None:
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be one of {FLOAT_DTYPES}, got {x.dtype}")
    if x.shape[-1] > MAX_NORM_WIDTH:
        raise ValueError(f"{name} rows of {x.shape[-1]} > {MAX_NORM_WIDTH} are not supported")
    if x.stride(-1) != 1:
        raise ValueError(f"{name} must have unit stride on its last dim, got {x.stride()}")
    if weight.shape != (x.shape[-1],) or weight.dtype != x.dtype or weight.stride(0) != 1:
        raise ValueError(
            f"weight must be a contiguous ({x.shape[-1]},) {x.dtype} tensor, got "
            f"{tuple(weight.shape)} {weight.dtype} with strides {weight.stride()}"
        )


def add_rms_norm_(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual += x; x = rmsnorm(residual) * weight`` in place on ``(tokens, hidden)`` rows;
    returns ``(x, residual)``: the model's ``(norm(x + residual), x + residual)``."""
    if x.dim() != 2 or residual.shape != x.shape:
        raise ValueError(
            f"x and residual must be one (tokens, hidden) shape, got {tuple(x.shape)} and "
            f"{tuple(residual.shape)}"
        )
    if residual.dtype != x.dtype or residual.stride(1) != 1:
        raise ValueError(
            f"residual must be {x.dtype} with unit stride on hidden, got {residual.dtype} "
            f"with strides {residual.stride()}"
        )
    _check_norm(x, weight, "x")
    check_device(_rms_norm_kernel, x, residual, weight)
    _launch_norm(x.unsqueeze(1), residual, weight, x.unsqueeze(1), eps)
    return x, residual


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``rmsnorm(x) * weight`` over the last dim of ``(tokens, width)`` or ``(tokens, heads,
    width)`` (e.g. strided q/k heads of a fused projection), into a new contiguous tensor."""
    if x.dim() not in (2, 3):
        raise ValueError(f"x must be (tokens, width) or (tokens, heads, width), got {x.shape}")
    _check_norm(x, weight, "x")
    check_device(_rms_norm_kernel, x, weight)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = x if x.dim() == 3 else x.unsqueeze(1)
    _launch_norm(rows, None, weight, out.view(rows.shape), eps)
    return out


def _launch_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    out: torch.Tensor,
    eps: float,
) -> None:
    """``x`` and ``out`` ``(tokens, heads, width)``; ``residual`` ``(tokens, width)`` or None."""
    num_tokens, num_heads, width = x.shape
    if num_tokens == 0 or num_heads == 0:
        return
    num_rows, block = num_tokens * num_heads, triton.next_power_of_2(width)
    # Rows of up to NORM_TILE elements per program: one row of 4096 and up, 4 of SmolLM2's 576
    # (padded to 1024), 32 heads of 128 (a q/k norm), instead of one program per row of 128.
    # Fixed per width, not fitted to num_rows: one compile per model, not one per batch size.
    block_r = max(1, NORM_TILE // block)
    # Without a residual its pointer and stride are never read; x stands in for them.
    r = x if residual is None else residual
    _rms_norm_kernel[(triton.cdiv(num_rows, block_r),)](
        x,
        r,
        weight,
        out,
        x.stride(0),
        x.stride(1),
        r.stride(0),
        out.stride(0),
        out.stride(1),
        num_rows,
        num_heads,
        float(eps),
        WIDTH=width,
        BLOCK=block,
        BLOCK_R=block_r,
        HAS_RESIDUAL=residual is not None,
        # About 8 elements (16 bytes of bf16) per thread: 16 warps for a full 4096 tile.
        num_warps=min(16, max(1, block_r * block // 256)),
    )


@triton.jit
def _silu_and_mul_kernel(
    gate_up_ptr,
    out_ptr,
    stride_in_tok,
    stride_out_tok,
    WIDTH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < WIDTH
    gate = tl.load(gate_up_ptr + tok * stride_in_tok + offs, mask=mask, other=0.0)
    up = tl.load(gate_up_ptr + tok * stride_in_tok + WIDTH + offs, mask=mask, other=0.0)
    dtype = gate.dtype
    g = gate.to(tl.float32)
    # torch's ``F.silu(gate) * up``: SiLU in fp32 rounded to the dtype, then the product rounded.
    # For gate < -88, exp(-gate) is inf and the quotient the -0 SiLU tends to.
    silu = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    tl.store(out_ptr + tok * stride_out_tok + offs, (silu * up.to(tl.float32)).to(dtype), mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate_up[:, :d]) * gate_up[:, d:]`` of ``(tokens, 2d)`` rows (any row stride) into
    a new contiguous ``(tokens, d)`` tensor."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(
            f"gate_up must be (tokens, 2 * d) to hold gate and up, got {gate_up.shape}"
        )
    if gate_up.dtype not in FLOAT_DTYPES:
        raise ValueError(f"gate_up must be one of {FLOAT_DTYPES}, got {gate_up.dtype}")
    if gate_up.stride(1) != 1:
        raise ValueError(f"gate_up must have unit stride on its last dim, got {gate_up.stride()}")
    check_device(_silu_and_mul_kernel, gate_up)
    num_tokens, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(num_tokens, width, dtype=gate_up.dtype, device=gate_up.device)
    if num_tokens == 0 or width == 0:
        return out
    _silu_and_mul_kernel[(num_tokens, triton.cdiv(width, SILU_BLOCK))](
        gate_up,
        out,
        gate_up.stride(0),
        out.stride(0),
        WIDTH=width,
        BLOCK=SILU_BLOCK,
        num_warps=4,
    )
    return out
