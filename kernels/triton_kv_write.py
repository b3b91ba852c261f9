"""Scatter a step's new K/V into the paged cache: the Triton twin of `kernels.reference.write_kv`.

One program per token moves that token's ``(num_kv_heads, head_size)`` K and V slices to its slot.
A slot is ``block * block_size + offset`` and the cache is contiguous, so the destination row is
simply ``slot * num_kv_heads * head_size``: no block-table lookup is needed here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_common import check_device, check_index, check_kv_cache


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    # int64: slot * row size passes 2**31 elements in caches over 4 GiB (bf16, one layer).
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    if slot < 0:  # a padding token (e.g. of a CUDA-graph batch): writing it would corrupt memory
        return
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_SIZE)
    src_k = tok * stride_k_tok + offs_h[:, None] * stride_k_head + offs_d[None, :]
    src_v = tok * stride_v_tok + offs_h[:, None] * stride_v_head + offs_d[None, :]
    # Head-major pages (num_blocks, Hkv, PAGE_SIZE, D): each head's row lands in its own tile.
    page = slot // PAGE_SIZE
    dst = (
        page * (NUM_KV_HEADS * PAGE_SIZE * HEAD_SIZE)
        + offs_h[:, None] * (PAGE_SIZE * HEAD_SIZE)
        + (slot % PAGE_SIZE) * HEAD_SIZE
        + offs_d[None, :]
    )
    k = tl.load(key_ptr + src_k, mask=mask)
    v = tl.load(value_ptr + src_v, mask=mask)
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter ``key``/``value`` ``(num_tokens, num_kv_heads, head_size)`` into the paged cache.

    ``key``/``value`` may be strided views (e.g. slices of a fused QKV projection) as long as
    ``head_size`` has unit stride. Another dtype than the cache's is cast by torch first (the
    engine never does this): torch rounds to nearest even like the reference, while the Triton
    interpreter's fp32->bf16 cast truncates. Tokens with a negative slot are skipped (the
    reference rejects them).
    """
    check_kv_cache(k_cache, v_cache)
    _, num_kv_heads, page_size, head_size = k_cache.shape
    for name, t in (("key", key), ("value", value)):
        if t.dim() != 3 or t.shape[1:] != (num_kv_heads, head_size):
            raise ValueError(
                f"{name} must be (num_tokens, {num_kv_heads}, {head_size}) to match the cache, "
                f"got {tuple(t.shape)}"
            )
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if t.stride(2) != 1:
            raise ValueError(f"{name} must have unit stride on head_size, got {t.stride()}")
    num_tokens = key.shape[0]
    if value.shape[0] != num_tokens:
        raise ValueError(f"value has {value.shape[0]} tokens, key has {num_tokens}")
    check_index(slot_mapping, "slot_mapping", num_tokens)
    check_device(_write_kv_kernel, key, value, k_cache, v_cache, slot_mapping)
    if num_tokens == 0:
        return
    key, value = key.to(k_cache.dtype), value.to(v_cache.dtype)
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_SIZE=head_size,
        PAGE_SIZE=page_size,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_size),
        # 4 warps x 32 lanes x 8 elements = 1024 = one Llama-8B token row (8 heads x 128) in
        # 16-byte bf16 vectors.
        num_warps=4,
    )
