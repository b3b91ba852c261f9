"""kernels/triton_quant.py: the int8 Triton GEMM against the torch reference, and the FP8 path
(torch's _scaled_mm) against its float32 emulation. On the CPU under the interpreter; with
``PATERNOSTER_TEST_DEVICE=cuda`` (ops/bench/gpu_check.sh) compiled, inputs drawn on the CPU and
moved."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from paged_cases import DEVICE

from kernels import quant_reference as qr
from kernels import triton_quant as tq
from worker.models.quant_cuda import Int8Linear


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("m", "k", "n"), [(1, 64, 64), (5, 77, 33), (17, 200, 130)])
def test_int8_linear_matches_reference(m: int, k: int, n: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(m * k + n)
    q, scale = qr.quantize_int8(torch.randn(n, k, generator=gen))
    x = torch.randn(m, k, generator=gen).to(dtype)
    bias = torch.randn(n, generator=gen)
    expected = qr.int8_linear(x.float(), q, scale, bias)
    got = tq.int8_linear(x.to(DEVICE), q.to(DEVICE), scale.to(DEVICE), bias.to(DEVICE)).cpu()
    assert got.dtype == dtype
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), expected, rtol=tol, atol=tol * 10)


def test_int8_linear_rejects_bad_arguments() -> None:
    q, scale = qr.quantize_int8(torch.randn(8, 16))
    with pytest.raises(ValueError, match=r"q must be \(N, 12\)"):
        tq.int8_linear(torch.zeros(2, 12), q, scale)
    with pytest.raises(ValueError, match="q must be contiguous int8"):
        tq.int8_linear(torch.zeros(2, 16), q.float(), scale)
    with pytest.raises(ValueError, match="scale must be float32"):
        tq.int8_linear(torch.zeros(2, 16), q, scale.double())
    with pytest.raises(ValueError, match="bias must hold 8"):
        tq.int8_linear(torch.zeros(2, 16), q, scale, torch.zeros(3))


@pytest.mark.parametrize(("m", "k", "n"), [(1, 32, 16), (7, 96, 48), (64, 160, 80)])
def test_fp8_linear_matches_its_emulation(m: int, k: int, n: int) -> None:
    gen = torch.Generator().manual_seed(m + k + n)
    w = torch.randn(n, k, generator=gen)
    w_fp8, w_scale = tq.quantize_fp8(w)
    assert w_fp8.dtype == torch.float8_e4m3fn and w_scale.shape == (n,)
    x = torch.randn(m, k, generator=gen)
    bias = torch.randn(n, generator=gen)
    emulated = tq.fp8_linear_reference(x, w_fp8, w_scale, bias)
    # e4m3 keeps 3 mantissa bits: each operand within 1/16 relative, the dot within a few %.
    exact = x @ w.T + bias
    assert float((emulated - exact).abs().max()) < 0.1 * float(exact.abs().max())
    if tq.fp8_supported(x.device):  # torch's CPU build has a _scaled_mm of its own
        torch.testing.assert_close(tq.fp8_linear(x, w_fp8, w_scale, bias), emulated)
    if DEVICE.type == "cuda":  # row-wise scales on CUDA: bf16 activations and output only
        xb, wd = x.bfloat16(), (w_fp8.to(DEVICE), w_scale.to(DEVICE), bias.to(DEVICE))
        got = tq.fp8_linear(xb.to(DEVICE), *wd).float().cpu()
        want = tq.fp8_linear_reference(xb, w_fp8, w_scale, bias).float()
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))


@pytest.mark.parametrize("code", [torch.int8, tq.FP8], ids=["int8", "e4m3"])
@pytest.mark.parametrize(
    "rows", sorted({1, 3} | {r for limit, _ in tq.TILES[:-1] for r in (limit, limit + 1)})
)
def test_w8_linear_on_every_tile_shape(rows: int, code: torch.dtype) -> None:
    """`w8_linear` at the rows on either side of each `TILES` boundary (each tile shape), N and
    K not multiples of any tile, bf16 activations: the dequantized weight's float32 product,
    to bf16's rounding."""
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(77, 600, generator=gen)
    q, scale = qr.quantize_int8(w) if code == torch.int8 else tq.quantize_fp8(w)
    x = torch.randn(rows, 600, generator=gen).bfloat16()
    bias = torch.randn(77, generator=gen)
    want = x.float() @ (q.float() * scale[:, None]).T + bias
    got = tq.w8_linear(*(t.to(DEVICE) for t in (x, q, scale, bias))).cpu()
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))


@pytest.mark.parametrize("rows", [1, 5, tq.WEIGHT_ONLY_MAX_ROWS + 3])
def test_int8_module_matches_the_reference_on_both_paths(rows: int) -> None:
    """`Int8Linear` (CUDA's ``--quantization int8``): the Triton kernel up to
    WEIGHT_ONLY_MAX_ROWS rows, the widened weight's GEMM beyond; either gives the int8
    reference's values."""
    gen = torch.Generator().manual_seed(rows)
    linear = torch.nn.Linear(96, 40, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(40, 96, generator=gen))
        linear.bias.copy_(torch.randn(40, generator=gen))
    x = torch.randn(rows, 3, 96, generator=gen)[:, 1]  # rows 3 apart: not contiguous
    module = Int8Linear.of(linear.to(DEVICE))
    assert module.q.dtype == torch.int8 and module.nbytes() == 40 * 96 + 40 * 4
    q, scale = qr.quantize_int8(linear.weight.cpu())
    want = qr.int8_linear(x, q, scale, linear.bias.detach().cpu())
    got = module(x.to(DEVICE)).cpu()
    assert got.shape == (rows, 40)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)


@pytest.mark.slow
def test_int8_kernel_compiles_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "kernels.compile_check", "--quant", "--dtypes", "bf16"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # 2 code formats x 4 tile classes (the largest with a bias), bf16 activations
    assert f"{2 * len(tq.TILES)} kernels compiled for sm_90" in done.stdout
