"""`kernels.triton_layer_ops` against `kernels.reference`, and the reference against the model.

Shapes are the model's and odd ones: SmolLM2's hidden 576 and 9 q on 3 KV heads of 64, Llama's
2048 and 32 on 8 heads of 128, 100 channels, 1, 3 and 17 rows, strided views of fused projections.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from paged_cases import DEVICE, DTYPES, dtype_id, on_device

from kernels import reference
from kernels.triton_layer_ops import add_rms_norm_, rms_norm, rotary_, silu_and_mul
from worker.models.config import RopeConfig
from worker.models.layers import RMSNorm, RotaryEmbedding, rotate

# Element-wise (rtol, atol). The Triton interpreter rounds fp32 -> bf16 by truncation where torch
# (and the GPU) rounds to nearest, and a kernel rounds twice (SiLU, then its product; the norm,
# then its weighted value): 2 bf16 ulps are 1.6e-2 relative. Measured worst cases: bf16 1.5e-2,
# fp16 one ulp (1e-3) where numpy's exp or the sum order differ from torch's, fp32 3e-7.
TOLERANCE = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    rtol, atol = TOLERANCE[expected.dtype]
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual.float(), expected.float(), rtol=rtol, atol=atol)


def randn(
    gen: torch.Generator, *shape: int, dtype: torch.dtype, scale: float = 1.0
) -> torch.Tensor:
    return on_device((torch.randn(*shape, generator=gen) * scale).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize(("tokens", "hidden"), [(1, 576), (3, 2048), (17, 100)])
def test_add_rms_norm_in_place(dtype: torch.dtype, tokens: int, hidden: int) -> None:
    gen = torch.Generator().manual_seed(tokens * hidden)
    # x as a slice of wider rows: the kernel takes any row stride.
    x = randn(gen, tokens, hidden + 12, dtype=dtype)[:, 5 : 5 + hidden]
    residual = randn(gen, tokens, hidden, dtype=dtype, scale=3.0)
    weight = randn(gen, hidden, dtype=dtype, scale=0.5) + 1
    expected, expected_sum = reference.add_rms_norm(x, residual, weight, 1e-5)
    out, total = add_rms_norm_(x, residual, weight, 1e-5)
    assert out is x and total is residual
    close(residual, expected_sum)
    close(x, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize(("heads", "head_size"), [(9, 64), (8, 128), (3, 100)])
def test_rms_norm_of_strided_heads(dtype: torch.dtype, heads: int, head_size: int) -> None:
    # Qwen3's q/k norms: heads of a fused QKV projection, rows wider than the heads.
    gen = torch.Generator().manual_seed(heads)
    qkv = randn(gen, 17, (heads + 4) * head_size, dtype=dtype, scale=2.0)
    q = qkv[:, : heads * head_size].view(17, heads, head_size)
    weight = randn(gen, head_size, dtype=dtype, scale=0.5) + 1
    out = rms_norm(q, weight, 1e-6)
    assert out.is_contiguous()
    close(out, reference.rms_norm(q, weight, 1e-6))
    flat = qkv[:3, :576]  # and plain (tokens, hidden) rows
    close(
        rms_norm(flat, weight.new_ones(576), 1e-6),
        reference.rms_norm(flat, flat.new_ones(576), 1e-6),
    )


def rope_tables(head_size: int, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's own tables, as `LlamaForCausalLM.forward` passes them: ``(T, 1, D/2)``."""
    rope = RopeConfig(theta=500000.0, kind="llama3", factor=8.0, original_max_position=64)
    cos, sin = RotaryEmbedding(head_size, 4096, rope).lookup(positions)
    return on_device(cos), on_device(sin)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize(
    ("tokens", "num_q_heads", "num_kv_heads", "head_size"),
    [(7, 9, 3, 64), (3, 32, 8, 128), (1, 4, 4, 80), (17, 6, 2, 64)],
)
def test_rotary_in_place_on_fused_qkv(
    dtype: torch.dtype, tokens: int, num_q_heads: int, num_kv_heads: int, head_size: int
) -> None:
    gen = torch.Generator().manual_seed(tokens * head_size)
    heads = num_q_heads + 2 * num_kv_heads
    qkv = randn(gen, tokens, heads * head_size, dtype=dtype, scale=2.0)
    q_end, k_end = num_q_heads * head_size, (num_q_heads + num_kv_heads) * head_size
    q = qkv[:, :q_end].view(tokens, num_q_heads, head_size)  # rows `heads` heads apart
    k = qkv[:, q_end:k_end].view(tokens, num_kv_heads, head_size)
    cos, sin = rope_tables(head_size, torch.randint(0, 4096, (tokens,), generator=gen))
    expected_q, expected_k = reference.rotary(q, cos, sin), reference.rotary(k, cos, sin)
    v_before = qkv[:, k_end:].clone()
    rotary_(q, k, cos, sin)
    close(q, expected_q)
    close(k, expected_k)
    assert torch.equal(qkv[:, k_end:], v_before)  # v, past k, untouched


def test_rotary_separate_q_and_k_with_flat_tables() -> None:
    # Qwen3: q and k are the norms' own contiguous outputs; (T, D/2) tables work too.
    gen = torch.Generator().manual_seed(5)
    q, k = randn(gen, 5, 4, 128, dtype=torch.float32), randn(gen, 5, 1, 128, dtype=torch.float32)
    cos, sin = (t[:, 0] for t in rope_tables(128, torch.tensor([0, 1, 2, 3000, 4095])))
    expected_q, expected_k = reference.rotary(q, cos, sin), reference.rotary(k, cos, sin)
    rotary_(q, k, cos, sin)
    close(q, expected_q)
    close(k, expected_k)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize(("tokens", "width"), [(1, 1536), (3, 2048), (17, 100)])
def test_silu_and_mul(dtype: torch.dtype, tokens: int, width: int) -> None:
    gen = torch.Generator().manual_seed(tokens * width)
    # Wide values reach both tails of SiLU; rows further apart than 2 * width (a strided view).
    gate_up = randn(gen, tokens, 3 * width, dtype=dtype, scale=8.0)[:, : 2 * width]
    out = silu_and_mul(gate_up)
    assert out.shape == (tokens, width) and out.is_contiguous()
    close(out, reference.silu_and_mul(gate_up))


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # numpy's, here
def test_silu_and_mul_tails() -> None:
    # exp(200) is inf and SiLU(-200) the -0 it tends to, not NaN.
    gate_up = on_device(torch.tensor([[-200.0, -30.0, 0.0, 30.0, 1.0, 2.0, 3.0, 4.0]]))
    close(silu_and_mul(gate_up), reference.silu_and_mul(gate_up))


def test_no_tokens() -> None:
    empty = on_device(torch.zeros(0, 64))
    assert add_rms_norm_(empty, empty.clone(), on_device(torch.ones(64)), 1e-6)[0].shape == (0, 64)
    assert rms_norm(empty, on_device(torch.ones(64)), 1e-6).shape == (0, 64)
    assert silu_and_mul(empty).shape == (0, 32)
    heads = on_device(torch.zeros(0, 2, 64))
    rotary_(heads, heads.clone(), on_device(torch.zeros(0, 1, 32)), on_device(torch.zeros(0, 32)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=dtype_id)
def test_reference_is_the_models_arithmetic(dtype: torch.dtype) -> None:
    # One statement of the semantics: the references are what `worker.models.layers` computes,
    # bit for bit in 16-bit dtypes (the model's fp32 norm is one fused torch call, ~1 ulp apart).
    gen = torch.Generator().manual_seed(2)
    exact = dtype != torch.float32
    x, residual = (torch.randn(5, 576, generator=gen).to(dtype) for _ in range(2))
    norm = RMSNorm(576, 1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(576, generator=gen))
        expected = norm.add_forward(x.clone(), residual.clone())
    got = reference.add_rms_norm(x, residual, norm.weight.detach(), 1e-5)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0 if exact else 1e-6, atol=0 if exact else 1e-6)
    heads = torch.randn(3, 12, 64, generator=gen).to(dtype)
    cos, sin = RotaryEmbedding(64, 512, RopeConfig()).lookup(torch.tensor([0, 7, 511]))
    assert torch.equal(reference.rotary(heads, cos, sin), rotate(heads, (cos, sin)))


W = torch.ones(64)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: add_rms_norm_(torch.zeros(3, 64), torch.zeros(4, 64), W, 1e-6), "one .* shape"),
        (lambda: add_rms_norm_(torch.zeros(3, 64), torch.zeros(3, 64).half(), W, 1e-6), "residual"),
        (lambda: add_rms_norm_(torch.zeros(3, 64), torch.zeros(3, 64), W.half(), 1e-6), "weight"),
        (lambda: rms_norm(torch.zeros(3, 64).double(), W.double(), 1e-6), "must be one of"),
        (lambda: rms_norm(torch.zeros(64, 3).t(), W, 1e-6), "unit stride"),
        (lambda: rms_norm(torch.zeros(2, 32768), torch.ones(32768), 1e-6), "not supported"),
        (lambda: rms_norm(torch.zeros(64), W, 1e-6), r"\(tokens, width\)"),
        (
            lambda: rotary_(torch.zeros(3, 2, 64), torch.zeros(3, 1, 32), W[:96], W[:96]),
            "k must be",
        ),
        (lambda: rotary_(torch.zeros(3, 2, 64), torch.zeros(3, 1, 64), W[:9], W[:9]), "cos must"),
        (lambda: rotary_(torch.zeros(2, 1, 6), torch.zeros(2, 1, 6).half(), W[:6], W[:6]), "dtype"),
        (lambda: rotary_(torch.zeros(2, 1, 5), torch.zeros(2, 1, 5), W[:5], W[:5]), "even"),
        (lambda: silu_and_mul(torch.zeros(2, 5)), "gate and up"),
        (lambda: silu_and_mul(torch.zeros(8, 2).t()), "unit stride"),
    ],
)
def test_rejects_bad_arguments(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]


@pytest.mark.skipif(DEVICE.type != "cpu", reason="checks the CPU refusal")
def test_needs_cuda_or_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kernels.triton_common.is_interpreted", lambda kernel: False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        silu_and_mul(torch.zeros(1, 8))
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        rms_norm(torch.zeros(1, 8), torch.ones(8), 1e-6)


def test_silu_reference_is_torchs() -> None:
    gate_up = torch.randn(4, 2 * 48, generator=torch.Generator().manual_seed(3)).bfloat16()
    gate, up = gate_up.split(48, dim=-1)
    assert torch.equal(reference.silu_and_mul(gate_up), F.silu(gate) * up)
