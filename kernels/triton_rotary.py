# mypy: disallow-untyped-defs=False
# (@triton.jit bodies use tl.constexpr annotations mypy cannot type.)
"""Rotate-half RoPE on q and k in place, one launch for both: the Triton twin of the rotary in
`cpu_layer_ops.cpp`, re-exported by `kernels.triton_layer_ops` with the decoder layer's other
per-token operations. Its arithmetic, rounding points included, is the model's torch code
(`worker.models.layers`, restated in `kernels.reference`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_common import FLOAT_DTYPES, check_device


@triton.jit
def _rotate_heads(
    x_ptr,
    stride_tok,
    stride_head,
    tok,
    num_heads,
    cos,
    sin,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    """Rotate token ``tok``'s heads of ``x`` in place: ``(x1, x2) -> (x1 c - x2 s, x2 c + x1 s)``
    on the two halves of each head, in fp32, rounded once to the dtype."""
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h[:, None] < num_heads) & (offs_d[None, :] < HALF)
    ptrs = x_ptr + tok * stride_tok + offs_h[:, None] * stride_head + offs_d[None, :]
    x1 = tl.load(ptrs, mask=mask, other=0.0)
    x2 = tl.load(ptrs + HALF, mask=mask, other=0.0)
    dtype = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    tl.store(ptrs, (x1 * cos[None, :] - x2 * sin[None, :]).to(dtype), mask=mask)
    tl.store(ptrs + HALF, (x2 * cos[None, :] + x1 * sin[None, :]).to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_cos_tok,
    stride_sin_tok,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HKV: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    # One program per token: its cos/sin row is read once for all q and k heads.
    tok = tl.program_id(0).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < HALF
    cos = tl.load(cos_ptr + tok * stride_cos_tok + offs_d, mask=d_mask, other=0.0)
    sin = tl.load(sin_ptr + tok * stride_sin_tok + offs_d, mask=d_mask, other=0.0)
    _rotate_heads(
        q_ptr, stride_q_tok, stride_q_head, tok, NUM_Q_HEADS, cos, sin, HALF, BLOCK_HQ, BLOCK_HALF
    )
    _rotate_heads(
        k_ptr, stride_k_tok, stride_k_head, tok, NUM_KV_HEADS, cos, sin, HALF, BLOCK_HKV, BLOCK_HALF
    )


def _check_heads(t: torch.Tensor, name: str, num_tokens: int, head_size: int) -> None:
    if t.dim() != 3 or t.shape[0] != num_tokens or t.shape[2] != head_size:
        raise ValueError(f"{name} must be ({num_tokens}, heads, {head_size}), got {tuple(t.shape)}")
    if t.stride(2) != 1:
        raise ValueError(f"{name} must have unit stride on head_size, got {t.stride()}")


def _check_table(t: torch.Tensor, name: str, num_tokens: int, half: int) -> torch.Tensor:
    """``(tokens, half)`` view of a cos or sin table ``(tokens, half)`` / ``(tokens, 1, half)``."""
    if t.dtype != torch.float32 or t.shape[0] != num_tokens or t.numel() != num_tokens * half:
        raise ValueError(
            f"{name} must be float32 with head_size / 2 = {half} values per token, got "
            f"{tuple(t.shape)} {t.dtype}"
        )
    rows = t.reshape(num_tokens, half)
    if half > 1 and rows.stride(1) != 1:
        raise ValueError(f"{name} must have unit stride on its last dim, got {t.stride()}")
    return rows


def rotary_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate ``q`` ``(T, Hq, D)`` and ``k`` ``(T, Hkv, D)`` in place by the float32 tables of
    `RotaryEmbedding.lookup` (``(T, 1, D/2)``; ``(T, D/2)`` too).

    ``q`` and ``k`` may be strided views (slices of a fused QKV projection) with unit stride on
    ``D``; they must not overlap. Both take one dtype.
    """
    if q.dim() != 3:
        raise ValueError(f"q must be (tokens, heads, head_size), got {tuple(q.shape)}")
    num_tokens, _, head_size = q.shape
    _check_heads(q, "q", num_tokens, head_size)
    _check_heads(k, "k", num_tokens, head_size)
    if head_size % 2:
        raise ValueError(f"head_size must be even, got {head_size}")
    if q.dtype not in FLOAT_DTYPES or k.dtype != q.dtype:
        raise ValueError(f"q and k must share one dtype of {FLOAT_DTYPES}: {q.dtype}, {k.dtype}")
    half = head_size // 2
    cos, sin = (
        _check_table(cos, "cos", num_tokens, half),
        _check_table(sin, "sin", num_tokens, half),
    )
    check_device(_rotary_kernel, q, k, cos, sin)
    if num_tokens == 0:
        return
    block_hq, block_hkv = triton.next_power_of_2(q.shape[1]), triton.next_power_of_2(k.shape[1])
    _rotary_kernel[(num_tokens,)](
        q,
        k,
        cos,
        sin,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos.stride(0),
        sin.stride(0),
        NUM_Q_HEADS=q.shape[1],
        NUM_KV_HEADS=k.shape[1],
        HALF=half,
        BLOCK_HQ=block_hq,
        BLOCK_HKV=block_hkv,
        BLOCK_HALF=triton.next_power_of_2(half),
        # Llama-3-8B: 32 q heads x 64 pairs = 2048 elements per half-tile, 8 per thread.
        num_warps=min(8, max(1, block_hq * half // 256)),
    )
