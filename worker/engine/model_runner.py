"""Turns the scheduler's decision into tensors and runs one packed forward pass.

The runner owns the device state: the model's weights and the per-layer paged KV caches. It
knows nothing of requests beyond what `SchedulerOutput` says.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from worker.attention import AttentionMetadata, get_attention_backend
from worker.engine.config import DEFAULT_CPU_KV_BYTES, CacheConfig, EngineConfig
from worker.engine.scheduler_output import ScheduledSequence, SchedulerOutput
from worker.models.config import ModelConfig
from worker.models.llama import LlamaForCausalLM, StepContext


@dataclass(frozen=True)
class RunnerOutput:
    """Logits ``(num_sampling, vocab)`` float32, one row per sequence that samples, in order."""

    request_ids: tuple[str, ...]
    logits: torch.Tensor
    seq_ids: tuple[int, ...]  # the same rows by sequence (a request with n > 1 has n of them)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def num_kv_blocks(
    cache: CacheConfig, model: ModelConfig, dtype: torch.dtype, device: torch.device
) -> int:
    """Blocks in the pool: explicit count, else a byte budget, else a share of free memory."""
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


class ModelRunner:
    def __init__(self, config: EngineConfig, model: LlamaForCausalLM, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.block_size = config.cache.block_size
        self.backend = get_attention_backend(config.attention_backend, device)
        mc = model.config
        dtype = model.embed_tokens.weight.dtype
        self.num_blocks = num_kv_blocks(config.cache, mc, dtype, device)
        shape = (self.num_blocks, mc.num_kv_heads, self.block_size, mc.head_size)
        # Zero-filled, not empty: padding slots of a partly filled block are read (and masked) by
        # the batched decode gather, and uninitialised memory may hold NaN, which masking keeps.
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=dtype, device=device),
                torch.zeros(shape, dtype=dtype, device=device),
            )
            for _ in range(mc.num_layers)
        ]

    @staticmethod
    def batch_order(output: SchedulerOutput) -> list[ScheduledSequence]:
        """Decodes longest first, then prefill chunks: the order rows are packed in.

        Decode attention pads each group of sequences to its longest; sorted neighbours waste
        little where running order would pad a 20-token chat to a 2k-token document.
        """
        d = output.num_decodes
        decodes = sorted(output.scheduled[:d], key=lambda s: -s.num_computed_tokens)
        return decodes + list(output.scheduled[d:])

    def prepare(
        self, items: Sequence[ScheduledSequence]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """Packed ``input_ids``, ``positions``, attention metadata and logits row indices."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        query_start = [0]
        logits_rows: list[int] = []
        max_blocks = max(len(s.block_ids) for s in items)
        tables = []
        for item in items:
            start = item.num_computed_tokens
            end = start + item.num_scheduled_tokens
            input_ids.extend(item.token_ids)
            positions.extend(range(start, end))
            table = item.block_ids
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            seq_lens.append(end)
            query_start.append(query_start[-1] + item.num_scheduled_tokens)
            if item.samples:
                logits_rows.append(query_start[-1] - 1)
            tables.append(list(table) + [0] * (max_blocks - len(table)))
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            query_start_loc=torch.tensor(query_start, dtype=torch.int32, device=dev),
            num_decodes=sum(1 for s in items if s.is_decode),
            max_seq_len=max(seq_lens),
            max_query_len=max(s.num_scheduled_tokens for s in items),
            seq_lens_host=tuple(seq_lens),
        )
        ids = torch.tensor(input_ids, dtype=torch.int64, device=dev)
        pos = torch.tensor(positions, dtype=torch.int64, device=dev)
        return ids, pos, meta, logits_rows

    @torch.inference_mode()
    def run(self, output: SchedulerOutput) -> RunnerOutput:
        items = self.batch_order(output)
        ids, pos, meta, rows = self.prepare(items)
        ctx = StepContext(meta=meta, backend=self.backend, kv_caches=self.kv_caches)
        hidden = self.model(ids, pos, ctx)
        sampling = [s for s in items if s.samples]
        request_ids = tuple(s.request_id for s in sampling)
        seq_ids = tuple(s.seq_id for s in sampling)
        if not rows:
            empty = hidden.new_empty((0, self.model.config.vocab_size)).float()
            return RunnerOutput(request_ids, empty, seq_ids)
        index = torch.tensor(rows, dtype=torch.int64, device=self.device)
        return RunnerOutput(request_ids, self.model.compute_logits(hidden[index]), seq_ids)
