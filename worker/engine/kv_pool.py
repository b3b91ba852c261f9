"""The paged KV pool's tensors: their dtype (`CacheConfig.dtype`), how many blocks, one K and one
V cache per layer."""

from __future__ import annotations

import os

import torch

from worker.attention import KVCache
from worker.attention.backend import AttentionBackend
from worker.engine import huge_pages
from worker.engine.config import DEFAULT_CPU_KV_BYTES, CacheConfig, InvalidConfigError
from worker.models.base import CausalLM
from worker.models.config import ModelConfig

# The dtypes `DtypeName` names (auto aside: each setting says what it picks).
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def kv_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """`CacheConfig.dtype`'s tensor dtype: auto keeps the model's."""
    return model_dtype if name == "auto" else DTYPES[name]


def num_kv_blocks(
    cache: CacheConfig, model: ModelConfig, dtype: torch.dtype, device: torch.device
) -> int:
    """Blocks in the pool: explicit count, else a byte budget, else a share of free memory.

    A byte budget holds twice the blocks in bf16 as in float32."""
    elem = torch.empty((), dtype=dtype).element_size()
    block_bytes = model.kv_bytes_per_token * elem * cache.block_size
    if cache.num_blocks is not None:
        return cache.num_blocks
    if cache.memory_bytes is not None:
        budget = cache.memory_bytes
    elif device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = int(free * cache.memory_fraction)
    else:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        budget = min(DEFAULT_CPU_KV_BYTES, available // 2)
    num = budget // block_bytes
    if num < 1:
        raise ValueError(f"KV budget of {budget} bytes holds no block of {block_bytes} bytes")
    return int(num)


def make_kv_caches(
    cache: CacheConfig, model: CausalLM, device: torch.device, backend: AttentionBackend
) -> list[KVCache]:
    """One zero-filled K and V cache per layer, ``(num_blocks, Hkv, block_size, D)``."""
    dtype = kv_dtype(cache.dtype, model.dtype)
    if dtype != model.dtype and not backend.mixed_kv_dtype:
        raise InvalidConfigError(
            f"the {backend.name} attention backend needs the KV cache in the model's dtype "
            f"({model.dtype}), not {dtype}: use --kv-cache-dtype auto"
        )
    mc = model.config
    shape = (
        num_kv_blocks(cache, mc, dtype, device),
        mc.num_kv_heads,
        cache.block_size,
        mc.head_size,
    )

    # Zero-filled, not empty: padding slots of a partly filled block are read (and masked) by
    # the batched decode gather, and uninitialised memory may hold NaN, which masking keeps.
    # On the CPU on huge pages: decode attention reads blocks scattered over the pool.
    def zeros() -> torch.Tensor:
        if device.type == "cpu":
            return huge_pages.zeros(shape, dtype)
        return torch.zeros(shape, dtype=dtype, device=device)

    return [KVCache(zeros(), zeros()) for _ in range(mc.num_layers)]
