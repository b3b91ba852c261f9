"""Engine configuration: frozen dataclasses passed down once, validated at construction."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

# 2 GiB of KV on CPU holds ~46k tokens of SmolLM2-135M (46 KB/token in fp32): far more than a
# 2-core machine can keep busy, and small enough to leave room for a second process.
DEFAULT_CPU_KV_BYTES = 2 * 1024**3


class InvalidConfigError(ValueError):
    """An engine setting is out of range; the message names the setting."""


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV pool's size (``num_blocks``, else ``memory_bytes``, else the fraction) and
    whether full blocks are kept and shared by content (automatic prefix caching)."""

    block_size: int = 16  # tokens per block
    num_blocks: int | None = None
    memory_bytes: int | None = None
    # On CUDA: share of the memory free after loading weights (activations need the rest).
    memory_fraction: float = 0.85
    # Requests sharing a prefix (a system prompt, earlier chat turns, the n choices of one request)
    # compute its full blocks once; off, the pool behaves exactly as it did without the cache.
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise InvalidConfigError("block_size must be >= 1")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise InvalidConfigError("num_blocks must be >= 1")
        if not 0.0 < self.memory_fraction <= 1.0:
            raise InvalidConfigError("memory_fraction must be in (0, 1]")


@dataclass(frozen=True)
class SchedulerConfig:
    """Per-step budgets of the continuous batch."""

    max_num_seqs: int = 64  # sequences in one step at most
    # Tokens computed in one step at most, summed over decodes and prefill chunks: a long prompt
    # is split across steps so decodes keep producing a token every step.
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None  # prompt + output cap; default: the model's and cache's
    # A waiting sequence that cannot start (no batch slot, no KV blocks) preempts running ones
    # of strictly less urgent priority. Strictly: two sequences can never preempt each other.
    preempt_for_priority: bool = True
    # A sequence preempted this many times to make room for urgency is no longer a victim, so
    # a steady trickle of urgent jobs cannot restart the same long job forever.
    max_priority_preemptions: int = 3
    # Fair-share weights by tenant (unlisted: 1.0): a tenant of weight 3 gets three times the
    # tokens of one of weight 1 when both have work waiting.
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    max_running_per_tenant: int | None = None  # running sequences per tenant; None: no cap

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise InvalidConfigError("max_num_seqs must be >= 1")
        if self.max_priority_preemptions < 0:
            raise InvalidConfigError("max_priority_preemptions must be >= 0")
        if any(w <= 0 for w in self.tenant_weights.values()):
            raise InvalidConfigError("tenant_weights must be > 0")
        if self.max_running_per_tenant is not None and self.max_running_per_tenant < 1:
            raise InvalidConfigError("max_running_per_tenant must be >= 1")
        # Every running decode must fit in one step's budget, or decodes would stall.
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise InvalidConfigError("max_num_batched_tokens must be >= max_num_seqs")


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # HF directory or .gguf file; None: the bundled SmolLM2-135M
    device: str = "auto"  # auto: cuda when available, else cpu
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: fp32 CPU, bf16 CUDA
    attention_backend: Literal["auto", "torch", "cpu", "triton"] = "auto"
    # CPU projections: auto packs weights for oneDNN where it supports the dtype and sends steps
    # of few rows to our C++ kernel, keeping a second, plain copy of the weights for it (see
    # worker/models/cpu_linear.py); onednn insists on oneDNN alone; torch keeps F.linear.
    linear_backend: Literal["auto", "torch", "onednn"] = "auto"
    seed: int = 0  # seeds unseeded sampling, so a whole run is reproducible
    num_threads: int | None = None  # torch intra-op threads on CPU; None: all cores
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
