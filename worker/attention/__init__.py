"""Attention backends over the paged KV cache: one interface; torch, C++ and Triton kinds."""

from worker.attention.backend import AttentionBackend, KernelCounts, get_attention_backend
from worker.attention.metadata import AttentionMetadata, KVCache

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "KVCache",
    "KernelCounts",
    "get_attention_backend",
]
