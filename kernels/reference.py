"""Pure-torch paged attention: the CPU path of the engine and the reference for the Triton kernels.

Layout shared by every kernel in this package (the Triton ones must match it exactly):

- KV cache, one per layer and per K/V: ``(num_blocks, block_size, num_kv_heads, head_size)``,
  contiguous. Token slot ``s`` lives in block ``s // block_size`` at offset ``s % block_size``.
- ``slot_mapping``: ``(num_tokens,)`` int64, the slot each new token's K/V is written to.
- ``block_tables``: ``(num_seqs, max_blocks_per_seq)`` int32; row ``b`` lists sequence ``b``'s
  blocks
  in order. Entries past the last block a sequence uses are padding (0) and are never read.
- ``seq_lens``: ``(num_seqs,)`` int32, the context length of each sequence *including* the tokens
  of this step (their K/V are written to the cache before attention runs).
- ``query_start_loc``: ``(num_seqs + 1,)`` int32 cumulative query lengths into the packed ``q``.
  Query token ``i`` of sequence ``b`` sits at position ``seq_lens[b] - q_len[b] + i`` and attends
  causally to every position up to and including its own.

These functions favour clarity over speed but avoid per-token Python loops: decode is one batched
gather + two batched matmuls, prefill one SDPA call per sequence.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter ``key``/``value`` ``(num_tokens, num_kv_heads, head_size)`` into the paged cache."""
    num_blocks, block_size, num_kv_heads, head_size = k_cache.shape
    flat_k = k_cache.view(num_blocks * block_size, num_kv_heads, head_size)
    flat_v = v_cache.view(num_blocks * block_size, num_kv_heads, head_size)
    flat_k.index_copy_(0, slot_mapping, key.to(k_cache.dtype))
    flat_v.index_copy_(0, slot_mapping, value.to(v_cache.dtype))


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, max_seq_len: int) -> torch.Tensor:
    """Gather each sequence's cache into a padded ``(num_seqs, L, num_kv_heads, head_size)``."""
    _, block_size, num_kv_heads, head_size = cache.shape
    num_seq_blocks = -(-max_seq_len // block_size)
    blocks = block_tables[:, :num_seq_blocks].long()
    gathered = cache[blocks]  # (B, nblk, block_size, Hkv, D)
    return gathered.view(blocks.shape[0], num_seq_blocks * block_size, num_kv_heads, head_size)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_seq_len: int | None = None,
) -> torch.Tensor:
    """One query token per sequence: ``q`` is ``(num_seqs, num_q_heads, head_size)``."""
    num_seqs, num_q_heads, head_size = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max().item())
    compute_dtype = torch.float32 if q.dtype != torch.float64 else torch.float64
    k = gather_kv(k_cache, block_tables, max_seq_len).to(compute_dtype)
    v = gather_kv(v_cache, block_tables, max_seq_len).to(compute_dtype)
    ctx = k.shape[1]
    # (B, Hkv, g, D) @ (B, Hkv, D, L) -> (B, Hkv, g, L): each KV head is read once per group.
    qg = q.to(compute_dtype).view(num_seqs, num_kv_heads, group, head_size)
    scores = torch.matmul(qg, k.permute(0, 2, 3, 1)) * scale
    pad = torch.arange(ctx, device=q.device)[None, :] >= seq_lens[:, None].to(q.device)
    scores.masked_fill_(pad[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, v.permute(0, 2, 1, 3))  # (B, Hkv, g, D)
    return out.reshape(num_seqs, num_q_heads, head_size).to(q.dtype)


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Varlen extend attention: ``q`` is ``(num_tokens, num_q_heads, head_size)``, packed."""
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    compute_dtype = torch.float32 if q.dtype != torch.float64 else torch.float64
    for b, ctx in enumerate(lens):
        q_start, q_end = starts[b], starts[b + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        k = gather_kv(k_cache, block_tables[b : b + 1], ctx)[0, :ctx]
        v = gather_kv(v_cache, block_tables[b : b + 1], ctx)[0, :ctx]
        q_pos = torch.arange(ctx - q_len, ctx, device=q.device)
        allowed = torch.arange(ctx, device=q.device)[None, :] <= q_pos[:, None]  # (q_len, ctx)
        attn = F.scaled_dot_product_attention(
            q[q_start:q_end].to(compute_dtype).transpose(0, 1)[None],
            k.to(compute_dtype).transpose(0, 1)[None],
            v.to(compute_dtype).transpose(0, 1)[None],
            attn_mask=allowed,
            scale=scale,
            enable_gqa=True,
        )  # (1, Hq, q_len, D)
        out[q_start:q_end] = attn[0].transpose(0, 1).to(q.dtype)
    return out


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Any mix of decodes and prefill chunks, by the definition in this module's docstring.

    The simplest correct statement of the contract, used by tests as ground truth: every sequence is
    handled by the varlen path.
    """
    return paged_prefill_attention(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale
    )
