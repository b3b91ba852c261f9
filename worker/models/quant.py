"""Projections and embeddings whose weights stay quantized: GGUF blocks or per-channel int8.

`QuantLinear` replaces an `nn.Linear` and keeps only the quantized weight (the float one is
dropped: no second copy). A step of few rows goes through our C++ kernels, which dequantize in
registers (kernels/cpu_quant_linear.cpp, cpu_int8_linear.cpp); a step of many rows (a prefill
chunk) dequantizes each weight into a transient fp32 buffer and runs oneDNN's GEMM on it, which
at that size beats both (`QuantWeight.gemm_min_rows`). Without the C++ build, the torch
references in kernels/quant_reference.py compute the same thing, slowly.

`QuantEmbedding` looks up rows of the same weights and dequantizes just those: a tied LM head and
its embedding share one quantized table (SmolLM2-135M: 30 MB of Q8_0 instead of 113 MB fp32).
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from kernels import quant_reference as qr

# Rows from which dequantize-then-oneDNN beats the register kernels: (GGUF blocks, int8), by
# the vector ISA the kernels were built for (`quant_isa`). `python ops/bench/quant_linear.py
# --rows 8 16 32 48 64 96 128 --repeats 3 [--avx2]` (1 thread, CPU ms, the bundled file's 210
# Q4_1 projections, Zen 5 EPYC, 2026-12-04), kernel / dequantize + oneDNN:
# - AVX-512: Q4_1 40.7 / 79.7 at 32 rows, 83.6 / 112.2 at 64, 124.3 / 134.4 at 96,
#   163.5 / 160.3 at 128 (Q8_0 like Q4_1); int8's kernel 116.8 at 64 rows, 170.2 at 96. GGUF's
#   was 64 too until the 8 x 3 register passes made its kernel 1.9x faster at 64 rows.
# - AVX2 (the -march=haswell build, 2 rows x 2 weight rows a pass): Q4_1 76.6 / 67.8 at 8
#   rows, 156.0 / 70.9 at 16; int8 133.0 at 8. The GEMM side there ran this machine's AVX-512
#   oneDNN (an AVX2 one is slower: about 2x on the GEMM, the same on the reorder, which is most
#   of it at 8-16 rows), so the AVX2 thresholds are estimates until an AVX2 machine measures
#   them; 64 had left AVX2 at 606 against 106 ms at 64 rows.
GEMM_MIN_ROWS = {"avx512": (128, 64), "avx2": (8, 4)}
# Rows up to which `--quant-activations int8` rounds x to 8 bits for GGUF blocks
# (`gguf_linear_q8`): every row count where the build has its VNNI GEMM (`q8_gemm_built`), else
# A8_MAX_ROWS. `python ops/bench/quant_linear.py --rows 1 2 4 8 16 32 64 128 --repeats 3 --avx2`
# (1 thread, CPU ms, the file's 210 Q4_1 projections, a 2-core Xeon with AVX-512 VNNI,
# 2026-12-04; ops/bench/results/quant-a8-1204/), exact gguf_linear / gguf_linear_q8:
# - VNNI: 11.1 / 7.7 at 1 row, 19.2 / 18.9 at 8, 35.6 / 25.5 at 16, 142.4 / 74.6 at 64 (fp32
#   oneDNN 130.0), 293.2 / 142.4 at 128 (228.3): from 3 rows the GEMM, whose lanes are weight
#   rows; the one-row-per-vector kernel lost from 4 rows (14.0 / 14.0, 8 rows 18.7 / 24.7).
# - AVX2 (the -march=haswell build, no GEMM): 24.9 / 11.5 at 1 row, 111.8 / 44.9 at 8, 455.2 /
#   176.8 at 32, 925.1 / 376.1 at 64, where dequantize + oneDNN (the exact path from
#   GEMM_MIN_ROWS) took 162.2 at 8 rows, 201.3 at 32 and 224.2 at 64.
A8_MAX_ROWS = 32
ANY_ROWS = 1 << 30  # a row count past any step's
# Rows from which `--quant-activations bfloat16` multiplies GGUF blocks in bfloat16: the weight
# dequantized to bf16 for the call, x rounded to bf16, oneDNN's bf16 GEMM (AMX tiles where the
# CPU has them), fp32 out. One layer's 7 Q4_1 projections of the bundled file, 2 threads, AMX
# Xeon, 2026-12-05, exact path / bf16 (ms, best of 7): 1.87 / 2.25 at 32 rows, 2.77 / 2.44 at
# 48, 3.84 / 2.52 at 64, 8.15 / 3.14 at 128, 13.8 / 4.24 at 256, 24.0 / 6.23 at 512. Without
# AMX or AVX-512 BF16 the bf16 GEMM has no hardware to run on: not measured there.
BF16_GEMM_MIN_ROWS = 48
ACTIVATIONS = ("float32", "int8", "bfloat16")  # EngineConfig.quant_activations' values
# Largest weight (as fp32) that path dequantizes: past glibc's 32 MiB mmap threshold each call's
# buffer is a fresh mapping, page-faulted in. The tied Q8_0 head (49,152 x 576, 113 MB as fp32)
# took 129 ms that way at 64 rows where `gguf_linear` took 41 (204 / 221 ms at 256 rows).
GEMM_MAX_BYTES = 32 << 20


class QuantWeight(nn.Module):
    """A ``(n, k)`` weight held quantized: GGUF blocks ``(n, row_bytes)`` uint8 of GGML type
    ``type_id``, or int8 codes ``(n, k)`` with per-row ``scale`` (``type_id`` None)."""

    data: torch.Tensor
    scale: torch.Tensor | None
    ops: ModuleType | None  # our C++ kernels, set by `attach`
    gemm_min_rows: int
    a8_max_rows: int  # rows up to which x is rounded to 8 bits (`gguf_linear_q8`); 0: never
    bf16_min_rows: int  # rows from which x and the weight are rounded to bf16; ANY_ROWS: never

    def __init__(
        self, data: torch.Tensor, type_id: int | None, scale: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        if (type_id is None) != (scale is not None):
            raise ValueError("int8 weights take a scale, GGUF blocks do not")
        self.type_id = type_id
        self.register_buffer("data", data.contiguous(), persistent=False)
        self.register_buffer("scale", scale, persistent=False)
        self.in_features = data.shape[1] if type_id is None else qr.in_features(data, type_id)
        self.out_features = data.shape[0]
        self.attach(None)  # the torch references until `attach` gives it our C++ kernels

    def attach(self, ops: ModuleType | None, activations: str = "float32") -> None:
        """Run on ``ops`` (our C++ kernels; None: the torch references); ``activations``
        (`ACTIVATIONS`) int8: x rounded to 8 bits for GGUF blocks, up to `a8_max_rows`;
        bfloat16: x and the weight rounded to bf16 for GGUF blocks, from `bf16_min_rows`."""
        if activations not in ACTIVATIONS:
            raise ValueError(f"unknown activations {activations!r}; expected {ACTIVATIONS}")
        self.ops = ops
        gguf, int8 = GEMM_MIN_ROWS[ops.quant_isa() if ops is not None else "avx512"]
        # Rows from which `linear` dequantizes into oneDNN's GEMM instead of the kernel.
        self.gemm_min_rows = int8 if self.type_id is None else gguf
        if activations != "int8" or self.type_id is None or ops is None:
            self.a8_max_rows = 0
        else:
            self.a8_max_rows = ANY_ROWS if ops.q8_gemm_built() else A8_MAX_ROWS
        bf16 = activations == "bfloat16" and self.type_id is not None and ops is not None
        self.bf16_min_rows = BF16_GEMM_MIN_ROWS if bf16 else ANY_ROWS

    @property
    def format_name(self) -> str:
        return "int8" if self.type_id is None else qr.block_format(self.type_id).name

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """Float32 rows ``index`` of the weight (the embedding lookup)."""
        data = self.data[index.reshape(-1)]
        if self.scale is not None:
            return data.float() * self.scale[index.reshape(-1), None]
        assert self.type_id is not None
        if self.ops is not None:
            return self.ops.gguf_dequantize(data, self.type_id)
        return qr.dequantize(data, self.type_id)

    def dequantize(self) -> torch.Tensor:
        if self.scale is not None:
            return qr.dequantize_int8(self.data, self.scale)
        assert self.type_id is not None
        if self.ops is not None:
            return self.ops.gguf_dequantize(self.data, self.type_id)
        return qr.dequantize(self.data, self.type_id)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W.T + bias`` in float32 for 2-D float32 ``x``."""
        ops = self.ops
        if ops is None:
            w = self.dequantize()
            return torch.nn.functional.linear(x, w, bias)
        if x.shape[0] <= self.a8_max_rows:
            return ops.gguf_linear_q8(x, self.data, self.type_id, bias)
        small = self.in_features * self.out_features * 4 <= GEMM_MAX_BYTES
        if x.shape[0] >= self.bf16_min_rows and small:
            # Transient: one weight in bf16 (3.5 MB at most for SmolLM2) for this call only.
            w16 = self.dequantize().to(torch.bfloat16)
            out = torch.nn.functional.linear(x.to(torch.bfloat16), w16).float()
            return out if bias is None else out.add_(bias)
        if (
            x.shape[0] >= self.gemm_min_rows
            and small
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        ):
            # Transient: one weight's fp32 (7 MB at most for SmolLM2) for this call only.
            packed = torch.ops.mkldnn._reorder_linear_weight(self.dequantize(), None)
            return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
        if self.scale is not None:
            return ops.int8_linear(x, self.data, self.scale, bias)
        return ops.gguf_linear(x, self.data, self.type_id, bias)

    def nbytes(self) -> int:
        scale = 0 if self.scale is None else self.scale.numel() * self.scale.element_size()
        return self.data.numel() * self.data.element_size() + scale


class QuantLinear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` a `QuantWeight` (shared with a tied embedding)."""

    def __init__(self, weight: QuantWeight, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.qweight = weight
        self.in_features, self.out_features = weight.in_features, weight.out_features
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.qweight
        ops = w.ops
        if (
            ops is not None
            and x.dim() == 2
            and x.dtype == torch.float32
            and x.shape[0] < w.gemm_min_rows
            and x.shape[0] < w.bf16_min_rows
            and x.stride(1) == 1
        ):
            # A decode step's (rows, k) float32, straight to the kernel: no reshape, no cast and
            # no second method call; 5.7 -> 2.5 us of Python a call (1 thread), 121 calls a
            # token on SmolLM2-135M.
            if w.type_id is None:
                return ops.int8_linear(x, w.data, w.scale, self.bias)
            if x.shape[0] <= w.a8_max_rows:
                return ops.gguf_linear_q8(x, w.data, w.type_id, self.bias)
            return ops.gguf_linear(x, w.data, w.type_id, self.bias)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x2.dtype != torch.float32 or x2.stride(-1) != 1:
            x2 = x2.float().contiguous()
        out = self.qweight.linear(x2, self.bias)
        return out.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"format={self.qweight.format_name}, bias={self.bias is not None}"
        )


class QuantEmbedding(nn.Module):
    """Token embeddings looked up in a `QuantWeight` ``(vocab, hidden)``, dequantized per row."""

    def __init__(self, weight: QuantWeight, dtype: torch.dtype) -> None:
        super().__init__()
        self.qweight = weight
        self.dtype = dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = self.qweight.rows(input_ids)
        return rows.reshape(*input_ids.shape, -1).to(self.dtype)


def attach(model: nn.Module, ops: ModuleType | None, activations: str = "float32") -> int:
    """Give every `QuantWeight` of ``model`` the C++ kernels (`QuantWeight.attach`); how many
    there are."""
    weights = [m for m in model.modules() if isinstance(m, QuantWeight)]
    for weight in weights:
        weight.attach(ops, activations)
    return len(weights)


def quantized_bytes(model: nn.Module) -> int:
    """Bytes of the quantized weights held (each shared table once)."""
    return sum(m.nbytes() for m in model.modules() if isinstance(m, QuantWeight))
