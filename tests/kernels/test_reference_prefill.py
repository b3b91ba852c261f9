"""The reference prefill's causal shortcut: a chunk with nothing before it takes SDPA's own
causal mask, and gives the same bits as the explicit mask every other chunk takes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import reference
from tests.kernels.paged_cases import make_paged_kv, query_start_loc

Q_HEADS, KV_HEADS, HEAD, BLOCK = 6, 2, 32, 16


def masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: int) -> torch.Tensor:
    """One sequence's chunk (its last ``len(q)`` positions) under an explicit mask."""
    q_len = q.shape[0]
    allowed = torch.arange(ctx)[None, :] <= torch.arange(ctx - q_len, ctx)[:, None]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k, v, attn_mask=allowed, scale=HEAD**-0.5, enable_gqa=True
    )
    return out[0].transpose(0, 1)


@pytest.mark.parametrize("compute_dtype", [None, torch.bfloat16])
def test_fresh_and_continued_chunks_match_the_explicit_mask_bit_for_bit(
    compute_dtype: torch.dtype | None,
) -> None:
    gen = torch.Generator().manual_seed(0)
    # (context, chunk): fresh prompts of odd lengths, then chunks after cached tokens.
    cases = [(37, 37), (130, 130), (1, 1), (90, 41), (64, 1), (200, 199)]
    ctxs, q_lens = [c for c, _ in cases], [n for _, n in cases]
    kv = make_paged_kv(ctxs, KV_HEADS, HEAD, BLOCK, torch.float32, gen)
    q = torch.randn(sum(q_lens), Q_HEADS, HEAD, generator=gen)
    starts = query_start_loc(q_lens)
    out = reference.paged_prefill_attention(
        q,
        kv.k_cache,
        kv.v_cache,
        kv.block_tables,
        kv.seq_lens,
        starts,
        HEAD**-0.5,
        compute_dtype=compute_dtype,
    )
    dtype = compute_dtype or torch.float32
    for b, (ctx, _) in enumerate(cases):
        lo, hi = int(starts[b]), int(starts[b + 1])
        k = reference.gather_kv(kv.k_cache, kv.block_tables[b : b + 1], ctx)[:, :, :ctx]
        v = reference.gather_kv(kv.v_cache, kv.block_tables[b : b + 1], ctx)[:, :, :ctx]
        want = masked(q[lo:hi].to(dtype), k.to(dtype), v.to(dtype), ctx).to(q.dtype)
        assert torch.equal(out[lo:hi], want), (ctx, hi - lo)
