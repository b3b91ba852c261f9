"""Paged prefill/extend attention for a packed varlen batch, in one launch.

Grid ``(cdiv(max_query_len, BLOCK_M), num_q_heads, num_seqs)``. Program ``(t, h, b)`` takes query
tile ``t`` of sequence ``b`` (rows ``t*BLOCK_M ..`` of its ``q_len`` new tokens) for query head
``h`` and runs an online softmax over the context keys it may see: the cached prefix
``[0, seq_len - q_len)`` plus the new tokens up to each row's own position (causal). Tiles past a
sequence's ``q_len`` exit at once, so decodes (``q_len == 1``) mixed into the batch cost one
16-row tile each.

K/V are read straight from the paged cache with a per-token block-table lookup, so the prefix
never has to be gathered into a contiguous buffer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_common import (
    check_device,
    check_index,
    check_kv_cache,
    check_query,
    dot_flags,
    head_block,
    load_kv_tile,
    num_stages,
    output_for,
)

# 64 x 64 tiles with 4 warps: the common starting point for a FlashAttention-2 forward on
# head sizes up to 128 (the Triton tutorial uses 128 x 64 with 8 warps for dense inputs; paged
# gathers favour smaller M). Untuned on the target GPU yet.
BLOCK_M = 64
BLOCK_N = 64
LOG2E = 1.4426950408889634


@triton.jit
def _paged_prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    out_ptr,
    scale_log2,
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_c_page,
    stride_c_tok,
    stride_c_head,
    stride_bt_seq,
    GROUP: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if tile * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix = seq_len - q_len
    kv_head = head // GROUP

    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # query rows within this sequence
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < q_len
    d_mask = offs_d < HEAD_SIZE
    q_pos = prefix + offs_m  # absolute position of each query row
    tok = (q_start + offs_m).to(tl.int64)
    q_offs = tok[:, None] * stride_q_tok + head * stride_q_head + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=m_mask[:, None] & d_mask[None, :], other=0.0)  # (M, D)
    if DOT_FP32:
        q = q.to(tl.float32)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max, log2 units
    denom = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    # The last row of this tile sees keys up to its own position; nothing past it is loaded.
    kv_end = prefix + tl.minimum(q_len, (tile + 1) * BLOCK_M)
    for kv_start in range(0, kv_end, BLOCK_N):
        pos = kv_start + offs_n
        n_mask = pos < kv_end
        k, v = load_kv_tile(
            k_cache_ptr,
            v_cache_ptr,
            table,
            pos,
            n_mask,
            d_mask,
            offs_d,
            kv_head,
            stride_c_page,
            stride_c_tok,
            stride_c_head,
            PAGE_SIZE,
            DOT_FP32,
        )
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2  # (M, N)
        # Key 0 is visible to every row, so each row's max is finite after the first tile.
        visible = (pos[None, :] <= q_pos[:, None]) & n_mask[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        denom = denom * alpha + tl.sum(p, 1)
        p_dot = p.to(v_cache_ptr.dtype.element_ty).to(v.dtype)
        acc = acc * alpha[:, None] + tl.dot(p_dot, v, input_precision=DOT_PRECISION)
        m = m_new

    out = acc / denom[:, None]
    o_offs = tok[:, None] * stride_o_tok + head * stride_o_head + offs_d[None, :]
    tl.store(
        out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :]
    )


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Varlen extend attention: ``q`` ``(num_tokens, num_q_heads, head_size)`` packed by sequence.

    ``max_query_len`` may be any upper bound of the query lengths (it sizes the grid); ``None``
    reads it from the device. ``out`` lets callers (and tests) supply the output buffer.
    """
    check_kv_cache(k_cache, v_cache)
    check_query(q, k_cache)
    num_tokens, num_q_heads, head_size = q.shape
    _, num_kv_heads, page_size, _ = k_cache.shape
    if seq_lens.dim() != 1:
        raise ValueError(f"seq_lens must be 1-D (num_seqs,), got {tuple(seq_lens.shape)}")
    num_seqs = seq_lens.shape[0]
    check_index(seq_lens, "seq_lens", num_seqs)
    check_index(block_tables, "block_tables", num_seqs, ndim=2)
    check_index(query_start_loc, "query_start_loc", num_seqs + 1)
    out = output_for(q, out)
    check_device(
        _paged_prefill_kernel, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out
    )
    if num_seqs == 0 or num_tokens == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max().item())
    if max_query_len <= 0:
        return out

    dot_fp32, dot_precision = dot_flags(q.dtype, q.device)
    block_d = head_block(head_size)
    grid = (triton.cdiv(max_query_len, BLOCK_M), num_q_heads, num_seqs)
    _paged_prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        out,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(2),  # token within a block
        k_cache.stride(1),  # KV head
        block_tables.stride(0),
        GROUP=num_q_heads // num_kv_heads,
        HEAD_SIZE=head_size,
        PAGE_SIZE=page_size,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_D=block_d,
        DOT_FP32=dot_fp32,
        DOT_PRECISION=dot_precision,
        num_warps=4,
        num_stages=num_stages(block_d, q.dtype),
    )
    return out
