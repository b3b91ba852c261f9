"""Paged decode attention (one query token per sequence) with GQA grouping and split-K.

Grid ``(num_seqs, num_kv_heads, num_splits)``. Each program owns one KV head of one sequence and
one contiguous slice of its context ("split", flash-decoding): it loads each K/V tile once and
applies it to all ``GROUP = num_q_heads // num_kv_heads`` query heads sharing that KV head, so K/V
bytes are read once per group rather than once per query head (4x fewer for Llama-8B's 32/8).

With one split the program normalises and writes the output directly. With several, each writes
a partial output normalised by its own softmax sum plus that sum's log-sum-exp, and
`_merge_splits_kernel` combines them: ``out = sum_i exp(lse_i - max) o_i / sum_i exp(lse_i - max)``.
All softmax work is in base 2 (``exp2``/``log2`` are the native instructions; the scale carries
``log2(e)``), accumulation is fp32.

Both dots are ``tl.dot`` even though a decode has only GROUP (1..8) query rows and ``tl.dot``
needs M >= 16: the group tile is padded to ``BLOCK_G = max(16, next_pow2(GROUP))`` masked rows.
The padding is free in bandwidth (q rows are tiny, K/V are the traffic) and keeps the FLOPs on
tensor cores; a broadcast-multiply-and-sum would hold a (GROUP, BLOCK_N, BLOCK_D) fp32 product in
registers (64 KiB for 4 x 32 x 128) and run on the CUDA cores.
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
    num_sms,
    num_stages,
    output_for,
)

# Tokens per K/V tile. 64 rows x 128 dims x 2 B = 16 KiB per K or V tile: two stages of K and V
# fit shared memory with room to spare. Untuned on the target GPU yet (see ops/bench/kernels.py).
BLOCK_N = 64
# A 256-token split reads 128 KiB of K/V per KV head (bf16, D 128) and writes GROUP x 512 B of
# partials (1.6% for GROUP 4). On an H200 (2026-12-04, `kernels.py --splits`, graph replays,
# 32/8 heads of 128, a grid sized for 131072 tokens), 64-token splits beat 256 at batch 1 and 8
# (11.4 against 17.0 us at batch 1, 528 tokens) and lost up to 9% at batch 32; 256 is the floor
# that the engine's steps were measured with (docs/bench/h200/2026-12-04c).
MIN_SPLIT_TOKENS = 256
MAX_SPLITS = 64
# Programs per SM to aim for: a decode program keeps only a few tiles in flight, so an SM needs
# several to cover HBM latency.
PROGRAMS_PER_SM = 4
LOG2E = 1.4426950408889634


@triton.jit
def _paged_decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    scale_log2,
    stride_q_seq,
    stride_q_head,
    stride_o_seq,
    stride_o_head,
    stride_c_page,
    stride_c_tok,
    stride_c_head,
    stride_bt_seq,
    min_split_len,
    num_splits,
    GROUP: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DIRECT_OUT: tl.constexpr,
    DOT_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    # Each sequence cuts its own context into the grid's splits (whole tiles, no shorter than
    # min_split_len), so every split count covers every length: a CUDA graph's grid, sized once,
    # splits short and long contexts alike.
    split_len = tl.maximum(tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N, min_split_len)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)  # start >= end: empty split, no loop trips

    offs_g = tl.arange(0, BLOCK_G)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + offs_g
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_SIZE
    q_offs = seq.to(tl.int64) * stride_q_seq + heads[:, None] * stride_q_head + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=g_mask[:, None] & d_mask[None, :], other=0.0)  # (G, D)
    if DOT_FP32:
        q = q.to(tl.float32)

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)  # running max, log2 units
    denom = tl.zeros([BLOCK_G], tl.float32)  # running softmax denominator, scaled by exp2(-m)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    for tile in range(start, end, BLOCK_N):
        pos = tile + offs_n
        n_mask = pos < end
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
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2  # (G, N)
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        denom = denom * alpha + tl.sum(p, 1)
        # p is rounded to the K/V dtype for a tensor-core dot, as in FlashAttention.
        p_dot = p.to(v_cache_ptr.dtype.element_ty).to(v.dtype)
        acc = acc * alpha[:, None] + tl.dot(p_dot, v, input_precision=DOT_PRECISION)
        m = m_new

    o_mask = g_mask[:, None] & d_mask[None, :]
    nonempty = denom > 0  # false only for splits past seq_len, or seq_len == 0 (batch padding)
    out = acc / tl.where(nonempty, denom, 1.0)[:, None]
    if DIRECT_OUT:
        o_offs = seq.to(tl.int64) * stride_o_seq + heads[:, None] * stride_o_head + offs_d[None, :]
        tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        # Empty splits (short sequences in a batch sized for a long one) store lse = -inf and a
        # zero partial; the merge gives them weight 0.
        lse = tl.where(nonempty, m + tl.log2(tl.where(nonempty, denom, 1.0)), float("-inf"))
        row = seq.to(tl.int64) * tl.num_programs(1) * GROUP + heads  # q-head row, (G,)
        part = row * num_splits + split
        tl.store(part_lse_ptr + part, lse, mask=g_mask)
        tl.store(part_out_ptr + part[:, None] * HEAD_SIZE + offs_d[None, :], out, mask=o_mask)


@triton.jit
def _merge_splits_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    stride_o_seq,
    stride_o_head,
    num_splits,
    HEAD_SIZE: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row = seq.to(tl.int64) * tl.num_programs(1) + head
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_SIZE
    lse = tl.load(
        part_lse_ptr + row * num_splits + offs_s, mask=offs_s < num_splits, other=float("-inf")
    )
    live = lse > float("-inf")
    # Split 0 holds token 0, so lse_max is finite unless seq_len == 0 (batch padding: all
    # weights 0, out = 0). Empty splits get exp2(-inf) = 0.
    lse_max = tl.max(lse, 0)
    w = tl.exp2(lse - tl.where(lse_max > float("-inf"), lse_max, 0.0))  # (S,)
    parts = part_out_ptr + (row * num_splits + offs_s)[:, None] * HEAD_SIZE + offs_d[None, :]
    o = tl.load(parts, mask=live[:, None] & d_mask[None, :], other=0.0)  # (S, D)
    w_sum = tl.sum(w, 0)
    out = tl.sum(w[:, None] * o, 0) / tl.where(w_sum > 0, w_sum, 1.0)
    o_offs = seq.to(tl.int64) * stride_o_seq + head * stride_o_head + offs_d
    tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=d_mask)


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, sms: int) -> int:
    """Splits per sequence so ``num_seqs * num_kv_heads * splits`` covers the GPU, from host ints.

    E.g. on 132 SMs (528 programs wanted) with 8 KV heads: batch 1 at 32k context -> 64 splits of
    512 tokens; batch 8 at 4k -> 9, recounted by the launcher to 8 splits of 512; batch 32 -> 3;
    batch 128 and up -> 1 (1024+ programs already).
    """
    programs = num_seqs * num_kv_heads
    wanted = -(-PROGRAMS_PER_SM * sms // programs)
    useful = -(-max_seq_len // MIN_SPLIT_TOKENS)
    return max(1, min(wanted, useful, MAX_SPLITS))


def split_plan(
    max_seq_len: int, num_splits: int, min_split_len: int = MIN_SPLIT_TOKENS
) -> tuple[int, int]:
    """``(num_splits, split_len)`` of the longest sequence: whole ``BLOCK_N`` tiles per split, no
    split under ``min_split_len``, the count recounted so that none is empty for it (1000 tokens
    in 3 splits -> 3 x 384; in 5 -> 4 x 256). The kernel cuts each shorter sequence the same way
    by its own length, into at most as many splits."""
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")
    if min_split_len < BLOCK_N or min_split_len % BLOCK_N:
        raise ValueError(f"min_split_len must be a multiple of {BLOCK_N}, got {min_split_len}")
    length = max(max_seq_len, 1)
    split_len = max(triton.cdiv(triton.cdiv(length, num_splits), BLOCK_N) * BLOCK_N, min_split_len)
    return triton.cdiv(length, split_len), split_len


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_seq_len: int | None = None,
    *,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    min_split_len: int = MIN_SPLIT_TOKENS,
) -> torch.Tensor:
    """One query token per sequence: ``q`` ``(num_seqs, num_q_heads, head_size)``.

    ``max_seq_len`` only sizes the grid (the split count): each sequence splits its own length,
    so any value is correct, and a CUDA graph passes max_model_len to keep its splits for long
    contexts; ``None`` reads it from the device like the reference. Rows with ``seq_len == 0``
    (batch padding) get zeros where the reference gives NaN. ``out`` lets callers (and tests)
    supply the output buffer; ``num_splits`` overrides `choose_num_splits`, and
    ``min_split_len`` (a multiple of ``BLOCK_N``) is the shortest split a sequence is cut into.
    """
    check_kv_cache(k_cache, v_cache)
    check_query(q, k_cache)
    num_seqs, num_q_heads, head_size = q.shape
    _, num_kv_heads, page_size, _ = k_cache.shape
    check_index(block_tables, "block_tables", num_seqs, ndim=2)
    check_index(seq_lens, "seq_lens", num_seqs)
    out = output_for(q, out)
    check_device(_paged_decode_kernel, q, k_cache, v_cache, block_tables, seq_lens, out)
    if num_seqs == 0:
        return out
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max().item())
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_seq_len, num_sms(q.device))
    num_splits, _ = split_plan(max_seq_len, num_splits, min_split_len)

    group = num_q_heads // num_kv_heads
    dot_fp32, dot_precision = dot_flags(q.dtype, q.device)
    block_d = head_block(head_size)
    direct = num_splits == 1
    if direct:
        part_out = part_lse = out  # unused placeholders
    else:
        part_out = q.new_empty((num_seqs, num_q_heads, num_splits, head_size), dtype=torch.float32)
        part_lse = q.new_empty((num_seqs, num_q_heads, num_splits), dtype=torch.float32)
    _paged_decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        part_out,
        part_lse,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(2),  # token within a block
        k_cache.stride(1),  # KV head
        block_tables.stride(0),
        min_split_len,
        num_splits,
        GROUP=group,
        HEAD_SIZE=head_size,
        PAGE_SIZE=page_size,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_N=BLOCK_N,
        BLOCK_D=block_d,
        DIRECT_OUT=direct,
        DOT_FP32=dot_fp32,
        DOT_PRECISION=dot_precision,
        num_warps=4,
        num_stages=num_stages(block_d, q.dtype),
    )
    if not direct:
        _merge_splits_kernel[(num_seqs, num_q_heads)](
            part_out,
            part_lse,
            out,
            out.stride(0),
            out.stride(1),
            num_splits,
            HEAD_SIZE=head_size,
            BLOCK_S=triton.next_power_of_2(num_splits),
            BLOCK_D=block_d,
            # Up to 64 splits x 128 dims of fp32 partials: 64 registers a thread with 4 warps.
            num_warps=4,
        )
    return out
