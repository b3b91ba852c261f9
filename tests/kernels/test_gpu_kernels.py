"""`use_gpu_kernels`: a model routed through the Triton layer kernels gives the logits of torch's.

The routing is for CUDA models; here the routed model runs on CPU tensors under Triton's
interpreter (``allow_interpreter``), or compiled with ``PATERNOSTER_TEST_DEVICE=cuda``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from paged_cases import DEVICE, dtype_id, rel_err

from kernels import triton_layer_ops
from tests.models.test_architectures import save_tiny
from worker.attention.backend import BackendName
from worker.engine.config import CacheConfig, EngineConfig
from worker.engine.model_runner import ModelRunner
from worker.engine.scheduler_output import ScheduledSequence, SchedulerOutput
from worker.models.gpu_kernels import use_gpu_kernels
from worker.models.layers import RMSNorm
from worker.models.llama import LlamaForCausalLM
from worker.models.loader import load_model

# Relative error of the logits, ||routed - torch|| / ||torch|| per row (worst row), measured on
# the interpreter: fp32 2e-7; fp16 0, bit-identical (numpy rounds to fp16 to nearest, as torch
# does); bf16 1.2e-2, all of it the interpreter's truncating fp32 -> bf16 casts, biased toward 0
# (torch's own bf16 logits are 6.5e-3 from fp32's, the routed ones 9.5e-3). On a GPU the casts
# round to nearest; fp16 is allowed the approximate exp and rsqrt there.
LOGITS_TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 3e-2}


def two_steps(model: LlamaForCausalLM, backend: BackendName) -> list[torch.Tensor]:
    """Logits of a 3-sequence prefill (1, 6 and 11 tokens), then of one decode step each.

    Few tokens: the interpreter runs each of a launch's programs (one per token) in turn."""
    config = EngineConfig(cache=CacheConfig(block_size=4, num_blocks=40), attention_backend=backend)
    runner = ModelRunner(config, model, DEVICE)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (1, 6, 11)]
    tables = [(39,), (5, 17), (30, 1, 12)]
    items = tuple(
        ScheduledSequence(f"s{i}", tuple(p), 0, t, True)
        for i, (p, t) in enumerate(zip(prompts, tables, strict=True))
    )
    first = runner.run(SchedulerOutput(items, 18, ()))
    step2 = tuple(
        ScheduledSequence(f"s{i}", (7 + i,), len(p), t, True)
        for i, (p, t) in enumerate(zip(prompts, tables, strict=True))
    )
    second = runner.run(SchedulerOutput(step2, 3, ()))
    order = sorted(range(3), key=lambda i: second.request_ids[i])  # decodes come longest first
    return [first.logits, second.logits[order]]


def compare(model_dir: Path, dtype: torch.dtype, backend: BackendName, routed: int) -> None:
    expected = two_steps(load_model(model_dir, dtype, DEVICE), "torch")
    model = load_model(model_dir, dtype, DEVICE)
    assert use_gpu_kernels(model, allow_interpreter=True) == routed
    got = two_steps(model, backend)
    for a, b in zip(got, expected, strict=True):
        err = rel_err(a, b)
        assert err < LOGITS_TOLERANCE[dtype], f"logits rel err {err:.2e}"


@pytest.mark.parametrize("dtype", list(LOGITS_TOLERANCE), ids=dtype_id)
@pytest.mark.parametrize(("family", "routed"), [("llama", 9), ("qwen3", 13)])
def test_routed_model_matches_torch(
    tmp_path: Path, family: str, routed: int, dtype: torch.dtype
) -> None:
    """2 layers x (2 norms, MLP, attention) + the final norm; Qwen3 adds q/k norms per layer.
    Attention through torch's backend, so only the routed ops differ."""
    compare(save_tiny(tmp_path, family), dtype, "torch", routed)


def test_routed_model_with_triton_attention(tmp_path: Path) -> None:
    """The CUDA configuration: Triton layer ops and Triton attention, against torch throughout."""
    compare(save_tiny(tmp_path, "llama"), torch.bfloat16, "triton", 9)


def test_routed_modules_call_the_kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_model(save_tiny(tmp_path, "llama"), torch.float32, DEVICE)
    use_gpu_kernels(model, allow_interpreter=True)
    calls: list[str] = []
    for name in ("add_rms_norm_", "rms_norm", "rotary_", "silu_and_mul"):
        real = getattr(triton_layer_ops, name)
        monkeypatch.setattr(
            triton_layer_ops, name, lambda *a, _n=name, _f=real: calls.append(_n) or _f(*a)
        )
    two_steps(model, "torch")
    # Per step and layer: rotary, MLP, the post-attention norm and the input norm (plain in the
    # first layer, fused with the residual add after it); then the final norm's add.
    per_step = {"rms_norm": 1, "add_rms_norm_": 4, "rotary_": 2, "silu_and_mul": 2}
    assert Counter(calls) == {name: 2 * n for name, n in per_step.items()}


def test_not_routed_off_cuda_or_in_mixed_dtypes(tmp_path: Path) -> None:
    model_dir = save_tiny(tmp_path, "llama")
    model = load_model(model_dir, torch.float32, torch.device("cpu"))
    assert use_gpu_kernels(model) == 0  # a CPU model, though the interpreter is on
    model.layers[0].input_layernorm.weight.data = model.layers[0].input_layernorm.weight.double()
    assert use_gpu_kernels(model, allow_interpreter=True) == 0
    assert all(m.gpu_ops is None for m in model.modules() if isinstance(m, RMSNorm))
