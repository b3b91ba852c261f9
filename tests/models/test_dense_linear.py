"""`dense_linear` (a transient fp32 weight's GEMM: oneDNN on AMD, MKL elsewhere) and the CPU
vendor it keys on."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from worker.models import cpu_vendor, quant_paths


@pytest.mark.parametrize("onednn", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_dense_linear_is_f_linear_on_either_library(
    monkeypatch: pytest.MonkeyPatch, onednn: bool, bias: bool
) -> None:
    monkeypatch.setattr(quant_paths, "_onednn_plain", lambda: onednn)
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(97, 65, generator=gen), torch.randn(33, 65, generator=gen)
    b = torch.randn(33, generator=gen) if bias else None
    got = quant_paths.dense_linear(x, w, b)
    torch.testing.assert_close(got, torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)
    # other dtypes always take F.linear
    half = quant_paths.dense_linear(x.bfloat16(), w.bfloat16(), None)
    assert half.dtype == torch.bfloat16


def test_cpu_vendor_reads_vendor_id(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\n")
    monkeypatch.setattr(cpu_vendor, "CPUINFO", info)
    cpu_vendor.cpu_vendor.cache_clear()
    try:
        assert cpu_vendor.cpu_vendor() == "AuthenticAMD"
        monkeypatch.setattr(cpu_vendor, "CPUINFO", tmp_path / "missing")
        monkeypatch.setattr(cpu_vendor.platform, "processor", lambda: "arm")
        cpu_vendor.cpu_vendor.cache_clear()
        assert cpu_vendor.cpu_vendor() == "arm"
    finally:
        cpu_vendor.cpu_vendor.cache_clear()
