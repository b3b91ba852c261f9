"""The Triton attention backend: the CUDA path, built on the kernels in `kernels.triton_*`.

On CPU tensors it runs under the Triton interpreter, which needs ``TRITON_INTERPRET=1`` set before
the kernels are first imported (the parity tests do this); otherwise the launchers raise.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.triton_decode import paged_decode_attention
from kernels.triton_kv_write import write_kv
from kernels.triton_prefill import paged_prefill_attention
from worker.attention.backend import AttentionBackend, KernelCounts
from worker.attention.metadata import AttentionMetadata, KVCache
from worker.models.cpu_linear import LinearBackend
from worker.models.gpu_kernels import use_gpu_kernels


class TritonAttentionBackend(AttentionBackend):
    """Decodes through the split-K decode kernel, prefill chunks through one varlen launch."""

    name = "triton"
    # The kernels skip slot -1 (kv write) and give zeros for seq_len 0 (decode), on the device.
    supports_cuda_graphs = True
    mixed_kv_dtype = False  # the kernels take q in the cache's dtype (triton_common.check_query)

    def install_kernels(self, model: nn.Module, linear_backend: LinearBackend) -> KernelCounts:
        """The Triton layer kernels (norms, SiLU, rotary) come with Triton attention; a model off
        CUDA takes none (`use_gpu_kernels`)."""
        packed = super().install_kernels(model, linear_backend).packed_linears
        return KernelCounts(packed, use_gpu_kernels(model))

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv: KVCache, meta: AttentionMetadata
    ) -> None:
        write_kv(key, value, kv.k_cache, kv.v_cache, meta.slot_mapping)

    def decode(
        self, q: torch.Tensor, kv: KVCache, meta: AttentionMetadata, scale: float, out: torch.Tensor
    ) -> None:
        d = q.shape[0]
        # meta.max_seq_len bounds the decodes' lengths too: an upper bound only sizes the grid,
        # so no device sync is needed to find the decodes' own max. A CUDA graph freezes it, so
        # graphs are captured with max_model_len (see `DeviceInputs.graph_views`).
        paged_decode_attention(
            q, *kv, meta.block_tables[:d], meta.seq_lens[:d], scale, meta.max_seq_len, out=out
        )

    def prefill(
        self, q: torch.Tensor, kv: KVCache, meta: AttentionMetadata, scale: float, out: torch.Tensor
    ) -> None:
        paged_prefill_attention(
            q,
            *kv,
            meta.block_tables,
            meta.seq_lens,
            meta.query_start_loc,
            scale,
            meta.max_query_len,
            out=out,
        )
