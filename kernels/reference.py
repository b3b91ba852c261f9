"""Pure-torch references for the kernels: paged attention (also the engine's CPU path), layer ops.

Layout shared by every kernel in this package (the Triton ones must match it exactly):

- KV cache, one per layer and per K/V: ``(num_blocks, num_kv_heads, block_size, head_size)``,
  contiguous. Token slot ``s`` lives in block ``s // block_size`` at offset ``s % block_size``.
  Head-major inside a block, so one head's ``block_size x head_size`` tile is contiguous: a GPU
  kernel loads it as one run, and on CPU a gather of whole blocks permutes into
  ``(seq, head, token, dim)`` for batched matmuls with one copy of contiguous tiles. The
  token-major layout ``(num_blocks, block_size, Hkv, D)`` made CPU decode 2.4x slower (24 vs
  10 ms per layer for 64 sequences of 600 tokens, SmolLM2 shapes, one core): its per-head slices
  are strided, so every matmul copied them first.
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
    block_size = k_cache.shape[2]
    blocks = slot_mapping // block_size
    offsets = slot_mapping % block_size
    # Advanced indices around a slice: the indexed view is (num_tokens, num_kv_heads, head_size).
    k_cache[blocks, :, offsets] = key.to(k_cache.dtype)
    v_cache[blocks, :, offsets] = value.to(v_cache.dtype)


def gather_kv(
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    max_seq_len: int,
    out: torch.Tensor | None = None,
    scratch: torch.Tensor | None = None,
) -> torch.Tensor:
    """Gather each sequence's cache into a padded ``(num_seqs, num_kv_heads, L, head_size)``.

    ``out`` and ``scratch`` (``(num_seqs * num_blocks_per_seq, Hkv, block_size, D)``) let a
    caller reuse buffers: a fresh multi-MB allocation per call faults its pages in every time,
    which made the in-model gathers 2-4x slower and their timing bimodal
    (ops/bench/decode_gather_probe.py: 36-112 ms per step fresh, 24-27 ms reused).
    """
    _, num_kv_heads, block_size, head_size = cache.shape
    num_seqs = block_tables.shape[0]
    num_seq_blocks = -(-max_seq_len // block_size)
    blocks = block_tables[:, :num_seq_blocks].reshape(-1).long()
    # Whole blocks in one index_select, then one permuting copy of contiguous head tiles.
    raw = torch.index_select(cache, 0, blocks, out=scratch) if scratch is not None else None
    raw = raw if raw is not None else cache.index_select(0, blocks)
    tiles = raw.view(num_seqs, num_seq_blocks, num_kv_heads, block_size, head_size)
    tiles = tiles.permute(0, 2, 1, 3, 4)
    shape = (num_seqs, num_kv_heads, num_seq_blocks * block_size, head_size)
    if out is None:
        return tiles.reshape(shape)
    out.view(num_seqs, num_kv_heads, num_seq_blocks, block_size, head_size).copy_(tiles)
    return out.view(shape)


def attend_gathered(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor, scale: float
) -> torch.Tensor:
    """Decode attention over gathered ``k``/``v`` ``(B, Hkv, L, D)``; ``q`` is ``(B, Hq, D)``."""
    num_seqs, num_q_heads, head_size = q.shape
    num_kv_heads, ctx = k.shape[1], k.shape[2]
    compute_dtype = torch.float32 if q.dtype != torch.float64 else torch.float64
    k, v = k.to(compute_dtype), v.to(compute_dtype)
    # (B, Hkv, g, D) @ (B, Hkv, D, L) -> (B, Hkv, g, L): each KV head is read once per group.
    qg = q.to(compute_dtype).view(num_seqs, num_kv_heads, num_q_heads // num_kv_heads, head_size)
    scores = torch.matmul(qg, k.transpose(2, 3)) * scale
    pad = torch.arange(ctx, device=q.device)[None, :] >= seq_lens[:, None].to(q.device)
    scores.masked_fill_(pad[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, v)  # (B, Hkv, g, D)
    return out.reshape(num_seqs, num_q_heads, head_size).to(q.dtype)


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
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max().item())
    k = gather_kv(k_cache, block_tables, max_seq_len)
    v = gather_kv(v_cache, block_tables, max_seq_len)
    return attend_gathered(q, k, v, seq_lens, scale)


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Varlen extend attention: ``q`` is ``(num_tokens, num_q_heads, head_size)``, packed.

    SDPA runs in ``compute_dtype``: by default float32 (float64 for float64 queries), whatever
    the cache holds; the output takes ``q``'s dtype."""
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    if compute_dtype is None:
        compute_dtype = torch.float32 if q.dtype != torch.float64 else torch.float64
    for b, ctx in enumerate(lens):
        q_start, q_end = starts[b], starts[b + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        k = gather_kv(k_cache, block_tables[b : b + 1], ctx)[:, :, :ctx]  # (1, Hkv, ctx, D)
        v = gather_kv(v_cache, block_tables[b : b + 1], ctx)[:, :, :ctx]
        if q_len == ctx:
            # A chunk with nothing before it: SDPA's own causal mask, which skips the blocks
            # above the diagonal (the same bits as the mask below, in 0.65-0.73x the time at
            # 1,024 tokens and 0.71-1.04x at 512: `ops/bench/prefill_attention.py`). Its mask is
            # aligned top-left, so a chunk after cached tokens keeps the explicit one.
            allowed = None
        else:
            q_pos = torch.arange(ctx - q_len, ctx, device=q.device)
            allowed = torch.arange(ctx, device=q.device)[None, :] <= q_pos[:, None]  # (q_len, ctx)
        attn = F.scaled_dot_product_attention(
            q[q_start:q_end].to(compute_dtype).transpose(0, 1)[None],
            k.to(compute_dtype),
            v.to(compute_dtype),
            attn_mask=allowed,
            scale=scale,
            is_causal=allowed is None,
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


# -- Per-token layer ops: the references for `kernels.triton_layer_ops` ---------------------------
# The arithmetic of `worker.models.layers` (tests hold the two equal), spelled out without the
# fused torch calls the model takes in fp32: statistics in float32, results rounded to the
# activation dtype where the model rounds them.


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x / rms(x))`` over the last dim; normalised in fp32, then rounded."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)``; the sum is rounded before it is normalised."""
    total = x + residual
    return rms_norm(total, weight, eps), total


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of ``x`` ``(T, H, D)`` by float32 ``cos``/``sin`` ``(T, D/2)``."""
    half = x.shape[-1] // 2
    cos, sin = cos.reshape(x.shape[0], 1, half), sin.reshape(x.shape[0], 1, half)
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``(T, 2d)`` rows holding ``[gate | up]``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
