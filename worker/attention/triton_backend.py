"""The Triton attention backend: the CUDA path, built on the kernels in `kernels.triton_*`.

On CPU tensors it runs under the Triton interpreter, which needs ``TRITON_INTERPRET=1`` set before
the kernels are first imported (the parity tests do this); otherwise the launchers raise.
"""

from __future__ import annotations

import torch

from kernels.triton_decode import paged_decode_attention
from kernels.triton_kv_write import write_kv
from kernels.triton_prefill import paged_prefill_attention
from worker.attention.backend import AttentionBackend
from worker.attention.metadata import AttentionMetadata


class TritonAttentionBackend(AttentionBackend):
    """Decodes through the split-K decode kernel, prefill chunks through one varlen launch."""

    name = "triton"
    # The kernels skip slot -1 (kv write) and give zeros for seq_len 0 (decode), on the device.
    supports_cuda_graphs = True

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> None:
        write_kv(key, value, k_cache, v_cache, meta.slot_mapping)

    def decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor,
    ) -> None:
        d = q.shape[0]
        # meta.max_seq_len bounds the decodes' lengths too: an upper bound only sizes the grid,
        # so no device sync is needed to find the decodes' own max. A CUDA graph freezes it, so
        # graphs are captured with max_model_len (see `DeviceInputs.graph_views`).
        paged_decode_attention(
            q,
            k_cache,
            v_cache,
            meta.block_tables[:d],
            meta.seq_lens[:d],
            scale,
            meta.max_seq_len,
            out=out,
        )

    def prefill(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor,
    ) -> None:
        paged_prefill_attention(
            q,
            k_cache,
            v_cache,
            meta.block_tables,
            meta.seq_lens,
            meta.query_start_loc,
            scale,
            meta.max_query_len,
            out=out,
        )
