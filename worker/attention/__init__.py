"""Attention backends over the paged KV cache: one interface; torch and Triton kinds."""

from worker.attention.backend import AttentionBackend, get_attention_backend
from worker.attention.metadata import AttentionMetadata

__all__ = ["AttentionBackend", "AttentionMetadata", "get_attention_backend"]
