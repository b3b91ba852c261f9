"""Our C++ layer kernels (`kernels/cpu_layer_ops.cpp`) and K/V write against torch's path.

Each kernel replaces a few torch calls in a float32 CPU model (`worker.models.cpu_kernels`); they
must agree with those calls to float32 rounding, on the strided views the model hands them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from paged_cases import make_paged_kv

from kernels import cpu_ops, reference
from tests.models.test_architectures import save_tiny
from worker.attention import AttentionMetadata, KVCache
from worker.attention.backend import get_attention_backend
from worker.models.cpu_kernels import use_cpu_kernels
from worker.models.layers import RMSNorm, SwiGLU, rotate
from worker.models.llama import StepContext
from worker.models.loader import load_model


@pytest.fixture(scope="module")
def ops():  # type: ignore[no-untyped-def]
    module = cpu_ops.load()
    assert module is not None, cpu_ops.unavailable_reason()
    return module


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tokens", [1, 7, 300])
def test_rotary_in_place_on_a_strided_view(ops, tokens: int) -> None:  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(tokens)
    qkv = torch.randn(tokens, 15 * 64, generator=gen)  # 9 q + 3 k + 3 v heads of 64
    positions = torch.randint(0, 4000, (tokens,), generator=gen)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, 64, 2).float() / 64)
    freqs = positions[:, None].float() * inv_freq[None, :]
    cos_sin = (freqs.cos()[:, None, :], freqs.sin()[:, None, :])
    qk = qkv[:, : 12 * 64].view(tokens, 12, 64)  # rows 15 * 64 apart
    expected = rotate(qk, cos_sin)
    v_before = qkv[:, 12 * 64 :].clone()
    ops.rotary_(qk, *cos_sin)
    close(qk, expected)
    assert torch.equal(qkv[:, 12 * 64 :], v_before)  # v, past the view, untouched


def test_rotary_rejects_bad_shapes(ops) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(4, 2, 8)
    with pytest.raises(RuntimeError, match="head_size / 2"):
        ops.rotary_(x, torch.ones(4, 1, 3), torch.ones(4, 1, 3))
    with pytest.raises(RuntimeError, match="contiguous heads"):
        ops.rotary_(torch.randn(4, 8, 2).transpose(1, 2), torch.ones(4, 4), torch.ones(4, 4))
    with pytest.raises(RuntimeError, match="dtype"):
        ops.rotary_(x.double(), torch.ones(4, 4), torch.ones(4, 4))


@pytest.mark.parametrize("tokens", [0, 1, 33, 200])
def test_silu_and_mul(ops, tokens: int) -> None:  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(tokens)
    # Wide enough values to reach both tails of SiLU (exp over- and underflow regions).
    gate_up = torch.randn(tokens, 2 * 1536, generator=gen) * 30
    gate, up = gate_up.split(1536, dim=-1)
    close(ops.silu_and_mul(gate_up), F.silu(gate) * up)
    strided = torch.randn(tokens, 4 * 96, generator=gen)[:, : 2 * 96]  # rows 384 floats apart
    gate, up = strided.split(96, dim=-1)
    close(ops.silu_and_mul(strided), F.silu(gate) * up)
    with pytest.raises(RuntimeError, match="gate and up"):
        ops.silu_and_mul(torch.randn(2, 5))


@pytest.mark.parametrize("tokens", [1, 7, 300])
def test_add_rms_norm_in_place(ops, tokens: int) -> None:  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(tokens)
    x, residual = torch.randn(2, tokens, 576, generator=gen)
    norm = RMSNorm(576, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(576, generator=gen))
    expected_sum = x + residual
    expected = norm(expected_sum)
    ops.add_rms_norm_(x, residual, norm.weight.detach(), 1e-5)
    close(residual, expected_sum)
    close(x, expected)
    with pytest.raises(RuntimeError, match="differ in shape"):
        ops.add_rms_norm_(torch.randn(2, 576), torch.randn(3, 576), norm.weight.detach(), 1e-5)


def test_norm_and_mlp_modules_match_torch(ops) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    norm, mlp = RMSNorm(48, 1e-6), SwiGLU(48, 80)
    x, residual = torch.randn(2, 9, 48)
    with torch.no_grad():
        expected = norm.add_forward(x.clone(), residual.clone())
        expected_mlp = mlp(x)
        norm.cpu_ops = mlp.cpu_ops = ops
        got = norm.add_forward(x.clone(), residual.clone())
        close(got[0], expected[0])
        close(got[1], expected[1])
        close(mlp(x), expected_mlp)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_write_kv_matches_reference(ops, cache_dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    """Bit for bit: a bf16 cache gets each value rounded as torch's ``.to(torch.bfloat16)``."""
    gen = torch.Generator().manual_seed(3)
    kv = make_paged_kv([20, 37], 3, 64, 16, cache_dtype, gen, fill_to=[0, 0])
    ref_k, ref_v = kv.k_cache.clone(), kv.v_cache.clone()
    slots = torch.cat([kv.slots(0, 0, 20), kv.slots(1, 0, 37)])
    qkv = torch.randn(57, 15 * 64, generator=gen)
    key = qkv[:, 9 * 64 : 12 * 64].view(57, 3, 64)  # strided rows, as the model passes them
    value = qkv[:, 12 * 64 :].view(57, 3, 64)
    reference.write_kv(key, value, ref_k, ref_v, slots)
    ops.write_kv(key, value, kv.k_cache, kv.v_cache, slots)
    assert torch.equal(kv.k_cache, ref_k) and torch.equal(kv.v_cache, ref_v)
    bad = slots.clone()
    bad[5] = kv.k_cache.shape[0] * 16
    with pytest.raises(RuntimeError, match="out of range"):
        ops.write_kv(key, value, kv.k_cache, kv.v_cache, bad)
    with pytest.raises(RuntimeError, match="slots for"):
        ops.write_kv(key, value, kv.k_cache, kv.v_cache, slots[:10])


def test_decode_takes_strided_query_rows(ops) -> None:  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(4)
    kv = make_paged_kv([5, 70, 33], 3, 64, 16, torch.float32, gen)
    q = torch.randn(3, 15 * 64, generator=gen)[:, : 9 * 64].view(3, 9, 64)
    strided, dense = torch.empty(3, 9, 64), torch.empty(3, 9, 64)
    args = (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 0.125)
    ops.paged_decode_attention(strided, q, *args)
    ops.paged_decode_attention(dense, q.contiguous(), *args)
    assert torch.equal(strided, dense)


def test_fused_model_matches_torch_model(ops, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A tiny Llama's step through the fused modules and `cpu` backend equals the torch path."""
    model_dir = save_tiny(tmp_path, "llama")
    plain = load_model(model_dir, torch.float32, torch.device("cpu"))
    fused = load_model(model_dir, torch.float32, torch.device("cpu"))
    # 2 layers x (2 norms, attention, MLP) + the final norm.
    assert use_cpu_kernels(fused, ops) == 9
    assert use_cpu_kernels(plain, None) == 0
    mc = plain.config
    shape = (4, mc.num_kv_heads, 16, mc.head_size)
    # A 20-token prefill into an empty cache, then one decode step that reads it back.
    steps = [(torch.arange(20), 0), (torch.tensor([20]), 1)]
    hidden: dict[str, list[torch.Tensor]] = {"plain": [], "fused": []}
    for name, model, backend_name in [("plain", plain, "torch"), ("fused", fused, "cpu")]:
        backend = get_attention_backend(backend_name, torch.device("cpu"))  # type: ignore[arg-type]
        caches = [KVCache(torch.zeros(shape), torch.zeros(shape)) for _ in range(mc.num_layers)]
        for positions, num_decodes in steps:
            n, end = positions.numel(), int(positions[-1]) + 1
            meta = AttentionMetadata(
                slot_mapping=positions.clone(),  # blocks 0 and 1, in order
                block_tables=torch.tensor([[0, 1]], dtype=torch.int32),
                seq_lens=torch.tensor([end], dtype=torch.int32),
                query_start_loc=torch.tensor([0, n], dtype=torch.int32),
                num_decodes=num_decodes,
                max_seq_len=end,
                max_query_len=n,
                seq_lens_host=(end,),
            )
            ids = (positions * 7 + 3) % mc.vocab_size
            with torch.inference_mode():
                hidden[name].append(model(ids, positions, StepContext(meta, backend, caches)))
    for fused_out, plain_out in zip(hidden["fused"], hidden["plain"], strict=True):
        close(fused_out, plain_out)


def test_bf16_model_takes_no_kernels(ops, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model = load_model(save_tiny(tmp_path, "llama"), torch.bfloat16, torch.device("cpu"))
    assert use_cpu_kernels(model, ops) == 0
