"""`DecodeStack` (worker/models/decode_stack.py, kernels/cpu_decode_stack.cpp): every layer of an
all-decode CPU step in one C++ call, bit-identical to the Python layers, and taken only where it
applies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from kernels import cpu_ops
from tests.models.test_architectures import FAMILIES, save_tiny
from worker.attention.cpu_backend import CpuAttentionBackend
from worker.engine.config import CacheConfig, EngineConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine.model_runner import ModelRunner
from worker.engine.sampling_params import SamplingParams
from worker.engine.scheduler_output import ScheduledSequence, SchedulerOutput
from worker.models import quant, quant_paths
from worker.models.cpu_linear import SKINNY_MAX_ROWS
from worker.models.decode_stack import DecodeStack
from worker.models.loader import load_model
from worker.models.quant import QuantWeight
from worker.models.quant_paths import ANY_ROWS

CPU = torch.device("cpu")
VOCAB = 97  # save_tiny's


class Counted:
    """Wraps a model's stack and counts the steps it ran."""

    def __init__(self, stack: DecodeStack) -> None:
        self.stack, self.calls = stack, 0

    def takes(self, num_tokens: int, ctx: Any) -> bool:
        return self.stack.takes(num_tokens, ctx)

    def __call__(self, *args: Any) -> torch.Tensor:
        self.calls += 1
        return self.stack(*args)


def runner_of(
    model_dir: Path,
    quantization: str = "none",
    stack: bool = True,
    arch: str | None = None,
    activations: str = "float32",
    kv_dtype: Any = "auto",
) -> ModelRunner:
    """A runner on our C++ kernels, with the stack counted or taken away; ``arch``: the
    kernels of that ``-march`` build instead of this machine's (fp32 only: a quantized model's
    weights hold this machine's build); ``activations``: `EngineConfig.quant_activations`;
    ``kv_dtype``: `CacheConfig.dtype`."""
    model: Any = load_model(model_dir, torch.float32, CPU, quantization, None, activations)
    cache = CacheConfig(block_size=4, num_blocks=64, dtype=kv_dtype)
    config = EngineConfig(cache=cache, attention_backend="cpu")
    runner = ModelRunner(config, model, CPU)
    if arch is not None:
        ops = cpu_ops.load(arch)
        assert ops is not None, cpu_ops.unavailable_reason(arch)
        runner.backend = CpuAttentionBackend(ops)
    runner.backend.install_kernels(model, "auto")
    assert isinstance(model.decode_stack, DecodeStack)
    model.decode_stack = Counted(model.decode_stack) if stack else None
    return runner


def gemm_min_rows(runner: ModelRunner) -> int:
    """Where the runner's quantized projections leave their kernel (`QuantWeight`)."""
    model: Any = runner.model
    return int(model.layers[0].self_attn.qkv_proj.qweight.gemm_min_rows)


def steps(
    runner: ModelRunner,
    num_seqs: int,
    decodes: int,
    vocab: int,
    follow: list[torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """Logits of a prefill step of ``num_seqs`` prompts of 2-11 tokens (a 1-token prompt is a
    decode, which `SchedulerOutput` orders first), then ``decodes`` (at most 4) all-decode steps,
    each feeding the argmax back (of ``follow``'s logits where given: another run's tokens);
    scattered block tables."""
    gen = torch.Generator().manual_seed(1)
    lengths = [2 + 5 * i % 10 for i in range(num_seqs)]
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    tables = [tuple(63 - 4 * i - j for j in range(4)) for i in range(num_seqs)]  # 16 tokens
    items = tuple(
        ScheduledSequence(f"s{i}", tuple(p), 0, tables[i], True, i) for i, p in enumerate(prompts)
    )
    out = runner.run(SchedulerOutput(items, sum(map(len, prompts)), ()))
    logits, computed = [out.logits.clone()], [len(p) for p in prompts]
    for _ in range(decodes):
        row = {seq_id: r for r, seq_id in enumerate(out.seq_ids)}
        led = out.logits if follow is None else follow[len(logits) - 1]
        nxt = [int(led[row[i]].argmax()) for i in range(num_seqs)]
        items = tuple(
            ScheduledSequence(f"s{i}", (nxt[i],), computed[i], tables[i], True, i)
            for i in range(num_seqs)
        )
        out = runner.run(SchedulerOutput(items, num_seqs, ()))
        computed = [c + 1 for c in computed]
        logits.append(out.logits.clone())
    return logits


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_decode_steps_equal_the_python_layers_bit_for_bit(
    tmp_path: Path, family: str, quantization: str
) -> None:
    """Tied, llama3 rope, biases on every projection, Mistral, Qwen2, Qwen3 (q/k norms, tied
    or not); fp32 and int8 weights."""
    model_dir = save_tiny(tmp_path, family)
    fused, plain = runner_of(model_dir, quantization), runner_of(model_dir, quantization, False)
    ours = steps(fused, 3, 4, VOCAB)
    theirs = steps(plain, 3, 4, VOCAB)
    stack: Any = fused.model.decode_stack
    assert stack.calls == 4  # the decodes only
    # Up to the rows at which each projection's Python path still calls the stack's kernel.
    expected = ANY_ROWS if quantization == "none" else gemm_min_rows(fused) - 1
    assert stack.stack.max_rows == expected
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
    for fused_kv, plain_kv in zip(fused.kv_caches, plain.kv_caches, strict=True):
        assert torch.equal(fused_kv.k_cache, plain_kv.k_cache)  # and it wrote the same K/V
        assert torch.equal(fused_kv.v_cache, plain_kv.v_cache)


def test_a_bf16_cache_runs_in_the_stack_and_a_float16_one_in_the_layers(tmp_path: Path) -> None:
    """`CacheConfig.dtype`: the stack reads and writes a bf16 cache as the Python layers do,
    bit for bit, close to the float32 cache's logits; a float16 cache, which the kernels do not
    take, leaves every step to the layers' torch path."""
    model_dir = save_tiny(tmp_path, "llama")
    fp32 = steps(runner_of(model_dir), 3, 4, VOCAB)
    fused, plain = (
        runner_of(model_dir, kv_dtype="bfloat16"),
        runner_of(model_dir, stack=False, kv_dtype="bfloat16"),
    )
    ours, theirs = steps(fused, 3, 4, VOCAB), steps(plain, 3, 4, VOCAB)
    stack: Any = fused.model.decode_stack
    assert stack.calls == 4 and fused.kv_caches[0].k_cache.dtype == torch.bfloat16
    for a, b, exact in zip(ours, theirs, fp32, strict=True):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, exact, rtol=0.05, atol=0.05)  # K/V rounded to 8 bits
    assert any(not torch.equal(a, b) for a, b in zip(ours, fp32, strict=True))
    for fused_kv, plain_kv in zip(fused.kv_caches, plain.kv_caches, strict=True):
        assert torch.equal(fused_kv.k_cache, plain_kv.k_cache)
        assert torch.equal(fused_kv.v_cache, plain_kv.v_cache)
    half = runner_of(model_dir, kv_dtype="float16")
    for a, exact in zip(steps(half, 3, 4, VOCAB), fp32, strict=True):
        torch.testing.assert_close(a, exact, rtol=0.01, atol=0.01)
    assert half.model.decode_stack.calls == 0  # type: ignore[union-attr]


@pytest.mark.slow  # the -march=haswell build takes about a minute on 2 cores the first time
def test_the_avx2_build_runs_the_stack_bit_for_bit(tmp_path: Path) -> None:
    """The AVX2 code paths (`cpu_ops.load("haswell")`, a module of its own beside this
    machine's, both DecodeStack classes loaded in one process)."""
    model_dir = save_tiny(tmp_path, "llama-bias")
    fused = runner_of(model_dir, arch="haswell")
    plain = runner_of(model_dir, stack=False, arch="haswell")
    native = runner_of(model_dir)  # this machine's build, loaded beside it
    for a, b in zip(steps(fused, 3, 3, VOCAB), steps(plain, 3, 3, VOCAB), strict=True):
        assert torch.equal(a, b)
    steps(native, 3, 1, VOCAB)
    assert fused.model.decode_stack.calls == 3  # type: ignore[union-attr]
    assert native.model.decode_stack.calls == 1  # type: ignore[union-attr]


def test_the_bundled_models_q4_1_blocks_equal_the_python_layers(smol_model_dir: Path) -> None:
    fused, plain = runner_of(smol_model_dir, "gguf"), runner_of(smol_model_dir, "gguf", False)
    stack: Any = fused.model.decode_stack
    assert stack.stack.max_rows == gemm_min_rows(fused) - 1
    vocab = fused.model.config.vocab_size
    for a, b in zip(steps(fused, 2, 3, vocab), steps(plain, 2, 3, vocab), strict=True):
        assert torch.equal(a, b)
    assert fused.model.decode_stack.calls == 3  # type: ignore[union-attr]


def test_int8_activations_round_in_the_stack_as_in_the_python_layers(
    smol_model_dir: Path,
) -> None:
    """``--quant-activations int8``: decode steps round x to 8 bits in the stack as `QuantLinear`
    does, bit for bit, at every row count."""
    fused = runner_of(smol_model_dir, "gguf", activations="int8")
    plain = runner_of(smol_model_dir, "gguf", False, activations="int8")
    exact = runner_of(smol_model_dir, "gguf", False)
    qkv: Any = fused.model.layers[0].self_attn.qkv_proj  # type: ignore[union-attr]
    assert qkv.qweight.a8_max_rows == ANY_ROWS
    vocab = fused.model.config.vocab_size
    ours, theirs = steps(fused, 2, 3, vocab), steps(plain, 2, 3, vocab)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
    assert fused.model.decode_stack.calls == 3  # type: ignore[union-attr]
    # Rounded, so not the exact path's logits (the prefill's neither: its LM head runs on the 2
    # last tokens, and with the GEMM its 9 rows everywhere), but near them, the exact run fed
    # the rounded run's tokens: on these random prompts 1.0-3.0 apart where the logits reach
    # 29-34, and the same top tokens up to near ties (on a Zen 3, step 1's exact top two were
    # 0.09 apart and rounding swapped them).
    floats = steps(exact, 2, 3, vocab, follow=ours)
    for a, b in zip(ours, floats, strict=True):
        assert not torch.equal(a, b)
        assert float((a - b).abs().max()) < 0.15 * float(b.abs().max())
        ours_top = b.gather(1, a.argmax(-1, keepdim=True)).squeeze(1)
        assert bool((ours_top >= b.max(-1).values - 0.5).all())  # the top token or a near tie


def test_int8_below_amx_bf16_reads_panels_in_the_stack_as_in_the_python_layers(
    smol_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``int8+bfloat16`` on AMX: x rounded to 8 bits below `BF16_OVER_INT8_MIN_ROWS` rows, on
    weights stored as panels (bf16 GEMMs dequantize them from there), which the stack takes up
    to those rows, bit for bit with the Python layers; the tied head (too large to dequantize a
    call) is stored as panels too and rounds x at every row count."""
    monkeypatch.setattr(quant, "amx_supported", lambda: True)
    monkeypatch.setattr(quant, "bf16_gemm_supported", lambda: True)
    fused = runner_of(smol_model_dir, "gguf", activations="int8+bfloat16")
    plain = runner_of(smol_model_dir, "gguf", False, activations="int8+bfloat16")
    qkv: Any = fused.model.layers[0].self_attn.qkv_proj  # type: ignore[union-attr]
    assert qkv.qweight.panels and qkv.qweight.a8_max_rows == quant_paths.BF16_OVER_INT8_MIN_ROWS - 1
    head: Any = fused.model.lm_head  # type: ignore[union-attr]
    assert head.qweight.panels and head.qweight.a8_max_rows == ANY_ROWS
    stack: Any = fused.model.decode_stack
    assert stack.stack.max_rows == quant_paths.BF16_OVER_INT8_MIN_ROWS - 1
    vocab = fused.model.config.vocab_size
    for a, b in zip(steps(fused, 2, 3, vocab), steps(plain, 2, 3, vocab), strict=True):
        assert torch.equal(a, b)
    assert fused.model.decode_stack.calls == 3  # type: ignore[union-attr]


def test_float32_steps_past_the_skinny_rows_run_onednn_in_the_stack(tmp_path: Path) -> None:
    """fp32 projections take `skinny_linear` up to `SKINNY_MAX_ROWS` rows and oneDNN's packed
    GEMM past them, in the stack as in `PackedLinear`: both sides of the cut, bit for bit."""
    model_dir = save_tiny(tmp_path, "llama-bias")
    for num_seqs in (SKINNY_MAX_ROWS, SKINNY_MAX_ROWS + 1, 14):  # fresh runners: fresh seq ids
        fused, plain = runner_of(model_dir), runner_of(model_dir, stack=False)
        ours = steps(fused, num_seqs, 2, VOCAB)
        for a, b in zip(ours, steps(plain, num_seqs, 2, VOCAB), strict=True):
            assert not a.isnan().any() and torch.equal(a, b)
        assert fused.model.decode_stack.calls == 2  # type: ignore[union-attr]


def test_models_the_stack_cannot_run_get_none(tmp_path: Path) -> None:
    """torch's own linears (``linear_backend="torch"``): no kernel of ours to call; quantized
    weights on another build's kernels than the backend's: the stack would not match them."""
    model: Any = load_model(save_tiny(tmp_path / "f", "llama"), torch.float32, CPU)
    runner = ModelRunner(EngineConfig(attention_backend="cpu"), model, CPU)
    runner.backend.install_kernels(model, "torch")
    assert model.decode_stack is None
    model = load_model(save_tiny(tmp_path / "q", "llama"), torch.float32, CPU, "int8")
    for module in model.modules():
        if isinstance(module, QuantWeight):
            module.attach(None)  # the torch references
    runner.backend.install_kernels(model, "auto")
    assert model.decode_stack is None


def test_engine_greedy_and_padded_steps_agree_with_and_without_it(tiny_model_dir: Path) -> None:
    """Through the engine: the stack takes plain decode steps (tokens and logprobs equal to the
    layers'), and leaves the padded static-buffer path (padding rows) to the layers."""

    def run(stack: bool, pad: bool) -> tuple[list[Any], int]:
        engine = LLMEngine(
            EngineConfig(
                model=str(tiny_model_dir),
                attention_backend="cpu",
                pad_decode_batches=pad,
                cache=CacheConfig(block_size=4, num_blocks=128),
            )
        )
        model: Any = engine.runner.model
        counted = Counted(model.decode_stack)
        model.decode_stack = counted if stack else None
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=2)
        prompts = ["Hello there", "The capital of France is", "1 2 3"]
        done = engine.generate(prompts, params)
        return [(c.token_ids, c.logprobs) for c in done], counted.calls

    with_stack, calls = run(True, False)
    assert calls >= 5 and with_stack == run(False, False)[0]
    padded, padded_calls = run(True, True)
    assert padded_calls == 0
    assert [ids for ids, _ in padded] == [ids for ids, _ in with_stack]
