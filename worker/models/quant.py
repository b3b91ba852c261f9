"""Projections and embeddings whose weights stay quantized: GGUF blocks or per-channel int8.

`QuantWeight` holds one such weight; `QuantLinear` (quant_layers.py) replaces an `nn.Linear`
with it and keeps only the quantized weight (the float one is dropped: no second copy). A step
of few rows goes through our C++ kernels, which dequantize in registers
(kernels/cpu_quant_linear.cpp, cpu_int8_linear.cpp); a step of many rows (a prefill chunk)
dequantizes each weight into a transient fp32 buffer and runs torch's GEMM on it, which at that
size beats the kernels (`QuantWeight.gemm_min_rows`; the row counts, measured, in
quant_paths.py). Without the C++ build, the torch references in kernels/quant_reference.py
compute the same thing, slowly.

`QuantEmbedding` looks up rows of the same weights and dequantizes just those: a tied LM head and
its embedding share one quantized table (SmolLM2-135M: 30 MB of Q8_0 instead of 113 MB fp32).
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import get_args, get_type_hints

import torch
from torch import nn

from kernels import quant_reference as qr
from worker.engine.config import EngineConfig
from worker.models import quant_paths as paths
from worker.models.quant_paths import ANY_ROWS, amx_supported, bf16_gemm_supported, dense_linear

log = logging.getLogger(__name__)

# `EngineConfig.quant_activations`' values, declared there (the config stays free of torch).
ACTIVATIONS: tuple[str, ...] = get_args(get_type_hints(EngineConfig)["quant_activations"])


class QuantWeight(nn.Module):
    """A ``(n, k)`` weight held quantized: GGUF blocks ``(n, row_bytes)`` uint8 of GGML type
    ``type_id``, or int8 codes ``(n, k)`` with per-row ``scale`` (``type_id`` None)."""

    data: torch.Tensor
    scale: torch.Tensor | None
    ops: ModuleType | None  # our C++ kernels, set by `attach`
    gemm_min_rows: int
    a8_max_rows: int  # rows up to which x is rounded to 8 bits (`gguf_linear_q8`); 0: never
    bf16_min_rows: int  # rows from which x and the weight are rounded to bf16; ANY_ROWS: never
    # Weight rows of each panel where `data` is stored as panels (quant_reference.pack_panels:
    # the build's `q8_panel_rows`), 0 where it keeps the file's layout.
    panel_rows: int
    kmajor: bool  # `data` stored k-major (quant_reference.pack_kmajor) for the exact kernel

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
        self.panel_rows, self.kmajor = 0, False
        self.attach(None)  # the torch references until `attach` gives it our C++ kernels

    def attach(self, ops: ModuleType | None, activations: str = "float32") -> None:
        """Run on ``ops`` (our C++ kernels; None: the torch references); ``activations``
        (`ACTIVATIONS`, GGUF blocks only) names how x is rounded: int8, to 8 bits up to
        `a8_max_rows`; bfloat16, x and the weight to bf16 from `bf16_min_rows`; int8+bfloat16,
        each where it is named, int8 below bf16's rows (`BF16_OVER_INT8_MIN_ROWS`; every row
        count without AMX); float32, never."""
        if activations not in ACTIVATIONS:
            raise ValueError(f"unknown activations {activations!r}; expected {ACTIVATIONS}")
        self.ops = ops
        isa = ops.quant_isa() if ops is not None else "avx512"
        # Whether a call may dequantize the whole weight (`GEMM_MAX_BYTES`); else the kernels
        # (or x's 8 bits) take every row count.
        small = self.in_features * self.out_features * 4 <= paths.GEMM_MAX_BYTES
        gguf_ops = self.type_id is not None and ops is not None
        kinds = set(activations.split("+")) if gguf_ops else set()
        bf16 = "bfloat16" in kinds and bf16_gemm_supported() and small
        a8 = "int8" in kinds
        self.bf16_min_rows = ANY_ROWS
        if bf16 and not a8:
            self.bf16_min_rows = paths.BF16_GEMM_MIN_ROWS
        elif bf16 and amx_supported():
            self.bf16_min_rows = paths.BF16_OVER_INT8_MIN_ROWS
        # int8: every row count, or those below bf16's where both are named and bf16 takes over
        self.a8_max_rows = 0
        if a8:
            bf16_from = self.bf16_min_rows
            self.a8_max_rows = ANY_ROWS if bf16_from == ANY_ROWS else bf16_from - 1
        self.store_layout()
        # Rows from which `linear` dequantizes into an fp32 GEMM instead of the kernel.
        rows = paths.GEMM_MIN_ROWS[isa]
        kind = rows.int8 if self.type_id is None else rows.kmajor if self.kmajor else rows.gguf
        self.gemm_min_rows = kind if small else ANY_ROWS

    def store_layout(self) -> None:
        """Store the blocks in the layout the kernels `attach` chose read: as panels where x is
        rounded to 8 bits at some row count (`a8_max_rows`) and our build's 8-bit GEMM reads them
        (`q8_panel_rows`: 16 rows on AVX-512 VNNI, 8 on AVX2), else in the file's layout. The
        GEMM then runs at every row count, widening the stored codes as it loads them, with no
        per-call transpose: on VNNI the bundled file's 210 projections took 3.8 ms at 1 row
        against the one-row kernel's 7.2, 9.9 against 18.7 at 8, 62.3 against 69.4 at 64 (1
        thread, Zen 4; BENCHMARKS.md). x's 8-bit kernels read panels, and so does the C++
        dequantizing of the bf16 GEMM's rows (`dequantize`); the exact kernels do not, so only
        weights whose every row count takes one of the two are stored so (x rounded to 8 bits
        wherever bf16 does not take over). A tied embedding reads its rows from them
        (`rows`). Until 2026-12-07 int8+bfloat16 on AMX kept the file's layout, so its decode
        steps transposed every panel per call: stored, its 210 projections went from 3.3 to
        2.2 ms at 1 row, 7.3 to 3.5 at 4, 9.8 to 8.5 at 16 (2 threads, AMX Xeon), its bf16
        steps within 2% at 512 rows, same tokens (BENCHMARKS.md).

        Else, where x stays exact at every row count below the GEMM's and our build
        has the k-major kernel for the format (`gguf_kmajor_supported`: Q4_0, Q4_1 and Q8_0 on
        AVX2 and AVX-512), the blocks are stored k-major (a tied embedding reads its rows from
        them, `gguf_kmajor_rows`). Q4_1 over the bundled file's 210 projections (1 thread, AMX
        Xeon, 2026-12-07): 1.18-1.31x the file layout's exact kernels at 1-8 rows, 1.39-1.72x at
        12-24 (BENCHMARKS.md, "AMX again"). On a Zen 5 (1 thread; the same projections, and the
        fp32 weights requantized to Q8_0 and Q4_0): 1.16-1.72x (Q4_1), 1.35-2.10x (Q8_0) and
        1.22-1.72x (Q4_0) at 1-64 rows; the AVX2 build there 1.02-1.21x, 1.08-1.59x and
        0.93-1.26x (BENCHMARKS.md, "k-major blocks for every format, and on AVX2")."""
        rows = self.ops.q8_panel_rows() if self.ops is not None else 0
        whole = rows > 0 and self.out_features % rows == 0
        panel_rows = rows if self.a8_max_rows > 0 and self.type_id is not None and whole else 0
        kmajor = (
            self.a8_max_rows == 0
            and self.bf16_min_rows == ANY_ROWS
            and self.type_id is not None
            and self.ops is not None
            and self.ops.gguf_kmajor_supported(self.type_id)
            and self.out_features % qr.KMAJOR_COLS == 0
        )
        if (panel_rows, kmajor) != (self.panel_rows, self.kmajor):
            assert self.type_id is not None
            data = self.blocks()  # the file's layout, from panels of any size or k-major
            if panel_rows:
                data = qr.pack_panels(data, self.type_id, panel_rows)
            elif kmajor:
                data = qr.pack_kmajor(data, self.type_id)
            self.data, self.panel_rows, self.kmajor = data, panel_rows, kmajor

    @property
    def panels(self) -> bool:
        """Whether `data` is stored as panels (`panel_rows`), not in the file's layout."""
        return self.panel_rows > 0

    def blocks(self) -> torch.Tensor:
        """The weight's bytes in the file's layout (a copy where they are stored otherwise)."""
        if self.panels:
            assert self.type_id is not None
            return qr.unpack_panels(self.data, self.type_id, self.panel_rows)
        if self.kmajor:
            assert self.type_id is not None
            return qr.unpack_kmajor(self.data, self.type_id)
        return self.data

    @property
    def format_name(self) -> str:
        return "int8" if self.type_id is None else qr.block_format(self.type_id).name

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """Float32 rows ``index`` of the weight (the embedding lookup)."""
        flat = index.reshape(-1)
        if self.panels:
            assert self.type_id is not None
            data = qr.panel_rows_of(self.data, self.type_id, self.panel_rows, flat)
        elif self.kmajor:  # stored so only where the build reads it
            assert self.type_id is not None and self.ops is not None
            data = self.ops.gguf_kmajor_rows(self.data, self.type_id, flat)
        else:
            data = self.data[flat]
        if self.scale is not None:
            return data.float() * self.scale[flat, None]
        assert self.type_id is not None
        if self.ops is not None:
            return self.ops.gguf_dequantize(data, self.type_id)
        return qr.dequantize(data, self.type_id)

    def dequantize(self, bf16: bool = False) -> torch.Tensor:
        """The weight in float32, or rounded to bfloat16 (GGUF blocks on our kernels write it
        so directly, never the fp32 copy)."""
        if self.scale is not None:
            w = qr.dequantize_int8(self.data, self.scale)
        else:
            assert self.type_id is not None
            if self.ops is not None and self.kmajor:
                w = self.ops.gguf_dequantize_kmajor(self.data, self.type_id)
                return w.to(torch.bfloat16) if bf16 else w
            if self.ops is not None:  # reads stored panels where they are
                return self.ops.gguf_dequantize(self.data, self.type_id, bf16, self.panel_rows)
            w = qr.dequantize(self.blocks(), self.type_id)
        return w.to(torch.bfloat16) if bf16 else w

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W.T + bias`` in float32 for 2-D float32 ``x``."""
        ops = self.ops
        if ops is None:
            w = self.dequantize()
            return torch.nn.functional.linear(x, w, bias)
        if x.shape[0] <= self.a8_max_rows:
            return ops.gguf_linear_q8(x, self.data, self.type_id, bias, self.panels)
        if x.shape[0] >= self.bf16_min_rows:
            # Transient: one weight in bf16 (3.5 MB at most for SmolLM2) for this call only.
            w16 = self.dequantize(bf16=True)
            out = torch.nn.functional.linear(x.to(torch.bfloat16), w16).float()
            return out if bias is None else out.add_(bias)
        if x.shape[0] >= self.gemm_min_rows:
            # Transient: one weight's fp32 (7 MB at most for SmolLM2) for this call only.
            return dense_linear(x, self.dequantize(), bias)
        if self.scale is not None:
            return ops.int8_linear(x, self.data, self.scale, bias)
        if self.kmajor:
            return ops.gguf_linear_kmajor(x, self.data, self.type_id, bias)
        return ops.gguf_linear(x, self.data, self.type_id, bias)

    def nbytes(self) -> int:
        scale = 0 if self.scale is None else self.scale.numel() * self.scale.element_size()
        return self.data.numel() * self.data.element_size() + scale


def attach(model: nn.Module, ops: ModuleType | None, activations: str = "float32") -> int:
    """Give every `QuantWeight` of ``model`` the C++ kernels (`QuantWeight.attach`); how many
    there are."""
    weights = [m for m in model.modules() if isinstance(m, QuantWeight)]
    if ops is not None and "bfloat16" in activations.split("+") and not bf16_gemm_supported():
        log.warning(
            "--quant-activations %s: this CPU has no bf16 arithmetic for oneDNN (AVX-512 or "
            "AMX), where bf16 GEMMs run emulated at about 4.5x the exact path's time; many-row "
            "steps stay exact",
            activations,
        )
    elif ops is not None and activations == "int8+bfloat16" and not amx_supported():
        log.info(
            "--quant-activations int8+bfloat16: this CPU has no AMX, where int8 beats bf16 at "
            "every row count; every step rounds to int8"
        )
    for weight in weights:
        weight.attach(ops, activations)
    return len(weights)


def quantized_bytes(model: nn.Module) -> int:
    """Bytes of the quantized weights held (each shared table once)."""
    return sum(m.nbytes() for m in model.modules() if isinstance(m, QuantWeight))
