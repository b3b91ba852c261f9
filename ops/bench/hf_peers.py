"""The Hugging Face peers of engine.py (``hf-static``, ``hf-cb``, ``hf-seq``; its docstring says
what each runs), each a `Runner` in ``HF_RUNNERS`` on the model ``load_hf`` loaded once.

No EOS id stops a peer: ``generate`` runs with ``eos_token_id=None`` (nothing is masked, so
greedy picks match our ``ignore_eos``) and continuous batching gets ``eos_token_id=-1``.
"""

from __future__ import annotations

import argparse
import inspect
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ops.bench.engine_workload import WARMUP_OUTPUT, BenchRequest, SystemResult
from worker.models.config import ModelConfig

Runner = Callable[[argparse.Namespace, Any, Sequence[BenchRequest], list[int]], SystemResult]


def load_hf(model_dir: Path, dtype: str = "float32", device: str = "cpu") -> Any:
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=getattr(torch, dtype), attn_implementation="sdpa"
    )
    model = model.to(device).eval()
    # No EOS: nothing stops early and no logit is masked, as with our ignore_eos. (Keeping EOS
    # and forcing min_new_tokens would mask it, so greedy picks would differ from ours at EOS.)
    model.generation_config.eos_token_id = None
    return model


def left_padded(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids, mask


def hf_generate(model: Any, prompts: Sequence[Sequence[int]], length: int) -> list[list[int]]:
    """Greedy, exactly ``length`` new tokens for each prompt of one left-padded batch."""
    pad = model.generation_config.pad_token_id
    ids, mask = left_padded(prompts, 0 if pad is None else int(pad))
    ids, mask = ids.to(model.device), mask.to(model.device)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=length,
            min_new_tokens=length,
            do_sample=False,
        )
    new = out[:, ids.shape[1] :]
    if new.shape[1] != length:
        raise RuntimeError(f"HF generate made {new.shape[1]} tokens, not the forced {length}")
    return [row.tolist() for row in new]


def run_hf_static(
    args: argparse.Namespace, model: Any, workload: Sequence[BenchRequest], warm: list[int]
) -> SystemResult:
    hf_generate(model, [warm, warm[:-3]], WARMUP_OUTPUT)
    outputs: dict[str, list[int]] = {}
    generated = 0  # padding included: every row runs to its batch's longest length
    size = args.hf_static_batch_size
    start = time.perf_counter()
    for i in range(0, len(workload), size):
        batch = workload[i : i + size]
        length = max(r.output_len for r in batch)
        rows = hf_generate(model, [r.prompt_ids for r in batch], length)
        generated += length * len(batch)
        for r, row in zip(batch, rows, strict=True):
            outputs[r.request_id] = row[: r.output_len]
    wall = time.perf_counter() - start
    extra = {"batch_size": size, "generated_tokens_incl_padding": generated}
    return SystemResult("hf-static", wall, outputs, extra)


def run_hf_sequential(
    args: argparse.Namespace, model: Any, workload: Sequence[BenchRequest], warm: list[int]
) -> SystemResult:
    hf_generate(model, [warm], WARMUP_OUTPUT)
    outputs: dict[str, list[int]] = {}
    start = time.perf_counter()
    for r in workload:
        outputs[r.request_id] = hf_generate(model, [r.prompt_ids], r.output_len)[0]
    return SystemResult("hf-seq", time.perf_counter() - start, outputs)


def page_field(config_class: type) -> str:
    """The name of the tokens-per-page field: ``page_size`` in later transformers (5.24 here),
    ``block_size`` in 5.17.0, whose config refused ``page_size`` on the H200 of 2026-12-04."""
    fields = inspect.signature(config_class).parameters
    return "page_size" if "page_size" in fields else "block_size"


def hf_cb_configs(args: argparse.Namespace, model: Any, max_output: int) -> tuple[Any, Any]:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    mc = ModelConfig.from_dir(args.model_dir)
    itemsize = getattr(torch, args.dtype).itemsize
    block_bytes = mc.kv_bytes_per_token * itemsize * args.hf_cb_page_size
    cb = ContinuousBatchingConfig(
        **{page_field(ContinuousBatchingConfig): args.hf_cb_page_size},
        num_blocks=max(1, args.kv_cache_bytes // block_bytes),  # the same KV bytes as ours
        max_batch_tokens=args.hf_cb_max_batch_tokens or args.max_num_batched_tokens,
        max_requests_per_batch=args.max_num_seqs,
        # Random prompts share no prefix: hashing is pure cost (ours keeps its prefix cache on,
        # the default, and pays for hashing full blocks too).
        allow_block_sharing=args.hf_cb_prefix_sharing,
    )
    pad = model.generation_config.pad_token_id
    gen = GenerationConfig(
        do_sample=False, max_new_tokens=max_output, eos_token_id=-1, pad_token_id=pad
    )
    return gen, cb


def collect_cb(manager: Any, ids: set[str], timeout_s: float) -> dict[str, Any]:
    """Wait for every request of ``ids`` to finish; fail loudly on errors or a dead loop."""
    done: dict[str, Any] = {}
    deadline = time.perf_counter() + timeout_s
    while len(done) < len(ids):
        result = manager.get_result(timeout=1.0)
        if result is None:
            if not manager.is_running() or time.perf_counter() > deadline:
                raise RuntimeError(
                    f"HF continuous batching stopped with {len(done)}/{len(ids)} done"
                )
            continue
        if result.error is not None:
            raise RuntimeError(f"HF continuous batching failed {result.request_id}: {result.error}")
        if result.is_finished() and result.request_id in ids:
            done[result.request_id] = result
    return done


def run_hf_cb(
    args: argparse.Namespace, model: Any, workload: Sequence[BenchRequest], warm: list[int]
) -> SystemResult:
    max_output = max(r.output_len for r in workload)
    gen, cb = hf_cb_configs(args, model, max_output)
    if args.hf_cb_attn == "paged|eager":
        model.set_attn_implementation("paged|eager")
    ids = {r.request_id for r in workload}
    with model.continuous_batching_context_manager(
        generation_config=gen, continuous_batching_config=cb, block=True, timeout=60
    ) as manager:
        manager.add_request(
            warm, request_id="warmup", max_new_tokens=WARMUP_OUTPUT, eos_token_id=-1
        )
        collect_cb(manager, {"warmup"}, args.hf_cb_timeout_s)
        attn = model.config._attn_implementation
        start = time.perf_counter()
        for r in workload:
            manager.add_request(
                list(r.prompt_ids),
                request_id=r.request_id,
                max_new_tokens=r.output_len,
                eos_token_id=-1,  # RequestState keeps no EOS id below 0: none can stop it
            )
        results = collect_cb(manager, ids, args.hf_cb_timeout_s)
        wall = time.perf_counter() - start
        resolved = manager.continuous_batching_config
        extra = {
            "attn_implementation": attn,
            "page_size": getattr(resolved, page_field(type(resolved))),
            "num_blocks": resolved.num_blocks,
            "max_batch_tokens": resolved.max_batch_tokens,
            "max_requests_per_batch": resolved.max_requests_per_batch,
            "prefix_sharing": resolved.allow_block_sharing,
        }
    model.set_attn_implementation("sdpa")
    outputs = {rid: list(res.generated_tokens) for rid, res in results.items()}
    return SystemResult("hf-cb", wall, outputs, extra)


HF_RUNNERS: dict[str, Runner] = {
    "hf-static": run_hf_static,
    "hf-cb": run_hf_cb,
    "hf-seq": run_hf_sequential,
}
