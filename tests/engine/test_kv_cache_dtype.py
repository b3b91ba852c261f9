"""`CacheConfig.dtype` (``--kv-cache-dtype``): the pool's tensors, its size, the backends that
take another dtype than the model's, and a greedy run on a bf16 cache through both CPU backends."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import torch

from worker.attention.torch_backend import TorchAttentionBackend
from worker.engine.config import CacheConfig, EngineConfig, InvalidConfigError
from worker.engine.kv_pool import make_kv_caches
from worker.engine.llm_engine import LLMEngine
from worker.engine.sampling_params import SamplingParams
from worker.models.loader import load_model

CPU = torch.device("cpu")


class SameDtypeOnly(TorchAttentionBackend):
    """A backend whose kernels take queries in the cache's dtype only (as triton's do)."""

    name = "same-dtype"
    mixed_kv_dtype = False


def test_the_pool_takes_the_dtype_and_holds_twice_the_blocks_in_bf16(tiny_model_dir: Path) -> None:
    model: Any = load_model(tiny_model_dir, torch.float32, CPU)
    budget = 1 << 20
    auto = make_kv_caches(CacheConfig(memory_bytes=budget), model, CPU, TorchAttentionBackend())
    bf16 = make_kv_caches(
        CacheConfig(memory_bytes=budget, dtype="bfloat16"), model, CPU, TorchAttentionBackend()
    )
    assert auto[0].k_cache.dtype == torch.float32 and bf16[0].v_cache.dtype == torch.bfloat16
    assert len(bf16) == len(auto) == model.config.num_layers
    assert bf16[0].k_cache.shape[0] == 2 * auto[0].k_cache.shape[0]
    assert bf16[0].k_cache.nbytes <= budget and not bf16[0].k_cache.any()  # zero-filled


def test_a_backend_that_takes_only_the_models_dtype_refuses_another(tiny_model_dir: Path) -> None:
    model: Any = load_model(tiny_model_dir, torch.float32, CPU)
    cache = CacheConfig(num_blocks=8, dtype="bfloat16")
    with pytest.raises(InvalidConfigError, match=r"same-dtype attention backend.*kv-cache-dtype"):
        make_kv_caches(cache, model, CPU, SameDtypeOnly())
    same = make_kv_caches(CacheConfig(num_blocks=8, dtype="float32"), model, CPU, SameDtypeOnly())
    assert same[0].k_cache.dtype == torch.float32


def test_the_flag_sets_the_cache_dtype() -> None:
    parser = argparse.ArgumentParser()
    EngineConfig.add_arguments(parser)
    assert EngineConfig.from_args(parser.parse_args([])).cache.dtype == "auto"
    args = parser.parse_args(["--kv-cache-dtype", "bfloat16"])
    assert EngineConfig.from_args(args).cache.dtype == "bfloat16"
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "int4"])


def test_greedy_on_a_bf16_cache_agrees_across_cpu_backends(tiny_model_dir: Path) -> None:
    """Our C++ kernels (decode stack included) and the torch path read the same bf16 K/V: the
    same tokens, logprobs within float32 rounding while prefill attends in float32; prefill in
    bf16 (`CpuAttentionBackend.bf16_prefill`, on where the CPU has AMX tiles or AVX-512 BF16)
    moves them by bf16 rounding only; the float32 cache's logprobs differ."""

    def run(backend: Any, kv_dtype: Any, bf16_prefill: bool = False) -> list[Any]:
        engine = LLMEngine(
            EngineConfig(
                model=str(tiny_model_dir),
                attention_backend=backend,
                cache=CacheConfig(block_size=4, num_blocks=128, dtype=kv_dtype),
            )
        )
        if backend == "cpu":
            engine.runner.backend.bf16_prefill = bf16_prefill  # type: ignore[attr-defined]
        params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=1)
        done = engine.generate(["Hello there", "The capital of France is", "1 2 3"], params)
        return [(c.token_ids, [lp.logprob for lp in c.logprobs]) for c in done]

    ours, theirs = run("cpu", "bfloat16"), run("torch", "bfloat16")
    exact = run("cpu", "auto")
    for (ids, lps), (ids_t, lps_t) in zip(ours, theirs, strict=True):
        assert ids == ids_t
        torch.testing.assert_close(torch.tensor(lps), torch.tensor(lps_t), rtol=1e-4, atol=1e-4)
    assert [lps for _, lps in ours] != [lps for _, lps in exact]
    rounded = run("cpu", "bfloat16", bf16_prefill=True)
    for (ids, lps), (ids_r, lps_r) in zip(ours, rounded, strict=True):
        assert ids == ids_r
        torch.testing.assert_close(torch.tensor(lps), torch.tensor(lps_r), rtol=0.02, atol=0.02)
    assert [lps for _, lps in rounded] != [lps for _, lps in ours]
