"""Which path a quantized projection (`QuantWeight.linear`) takes at which row count: the row
thresholds, each beside the measurements that set it, the CPU features they depend on, and the
dense GEMM a weight is dequantized into past them (`dense_linear`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GemmRows:
    """Rows from which a weight is dequantized into an fp32 GEMM (`dense_linear`) instead of
    running its kernel, for one vector ISA."""

    gguf: int  # GGUF blocks in the file's layout
    kmajor: int  # GGUF blocks stored k-major
    int8: int  # per-channel int8 weights


# `GemmRows.gguf` and `.int8`: rows from which dequantize-then-GEMM (a transient fp32 weight
# into `F.linear`) beats the register kernels, by the vector ISA the kernels were built for
# (`quant_isa`). `python ops/bench/quant_linear.py --rows ... --repeats 3` (1 thread, CPU ms,
# the bundled file's 210 Q4_1 projections), kernel / dequantize + GEMM:
# - AVX-512 (Zen 5 EPYC, 2026-12-04): Q4_1 40.7 / 79.7 at 32 rows, 83.6 / 112.2 at 64, 124.3 /
#   134.4 at 96, 163.5 / 160.3 at 128 (Q8_0 like Q4_1); int8's kernel 116.8 at 64 rows, 170.2
#   at 96. That GEMM side reordered the weight for oneDNN first (`q4_1_deq_onednn`), which every
#   later run found slower than plain `F.linear` (`q4_1_deq`; AVX-512 Xeon, 2026-12-04: 224.5
#   against 334.5 ms at 128 rows, 141.1 against 224.2 at 64), so 128 was late. Against
#   `F.linear` the Q4_1 kernel / `q4_1_deq` cross between 48 and 64 rows on both AVX-512 Xeons
#   measured: 142.4 / 141.1 at 64 (2026-12-04); 94.1 / 93.6 at 48, 114.2 / 105.7 at 56,
#   127.6 / 109.8 at 64, 188.1 / 146.4 at 96 (AMX Xeon, 2026-12-05;
#   ops/bench/results/quant-avx512-1205/). int8 weights keep 64 (their dequantize is torch's).
#   Since 2026-12-06 AVX-512 builds run an fp32 tile from 16 rows (kernels/cpu_gguf_tile.h),
#   each block dequantized once per call, not once per 8 rows: AMX Xeon, in one process,
#   alternated (ops/bench/results/avx512-tile-1206/), Q4_1 tile / dequantize + GEMM, 1 thread:
#   84.5 / 108.3 at 32, 146.7 / 171.7 at 64, 210.8 / 201.7 at 96, 283.5 / 247.9 at 128; 2
#   threads: 86.7 / 104.6 at 64, 119.8 / 112.8 at 96. So the GEMM from 80 rows.
# - int8 weights, since 2026-12-06 through the same tile from 16 rows (`int8_linear`, k a multiple
#   of the vector), against dequantize (torch's codes * scale) + GEMM, in one process on the AMX
#   Xeon (ops/bench/results/avx512-tile-1206/int8_tile.txt), tile / GEMM, 2 threads: 94.2 /
#   311.6 at 64 rows, 357.7 / 491.9 at 256, 561.8 / 596.0 at 384, 817.5 / 699.5 at 512; the
#   haswell build (MKL and oneDNN held to AVX2): 208.0 / 367.4 at 128, 479.6 / 626.4 at 256,
#   1034.4 / 981.3 at 512. So the GEMM from 384 rows on either ISA (was 64 and 32, set against
#   the register kernels: 1.5-2.3x slower than the tile from 24 rows).
# - AVX2 (Zen 3 EPYC, 2026-12-05; ops/bench/results/quant-avx2-1205/): Q4_1 41.7 / 55.0 at 2
#   rows, 72.3 / 65.9 at 3, 83.3 / 62.3 at 4, 175.6 / 73.6 at 8 (2 rows x 2 weight rows a pass,
#   each block dequantized again per 2 rows: 9.5 ms a row). int8's 4 is not measured: its kernel
#   took 63.1 ms at 2 rows, 122.1 at 3.
#   Since 2026-12-06 AVX2 builds run kernels/cpu_gguf_avx2.cpp: native ymm registers below 16
#   rows, an fp32 tile of 3 weight rows from 16 (each block dequantized once per call). The
#   haswell build on a Zen 4 EPYC (no AVX2-only CPU that session; PATERNOSTER_CPU_ARCH=haswell
#   MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2; ops/bench/results/avx2-tile-1206/
#   quant_linear_avx2_final.json), Q4_1 kernel / dequantize + GEMM / fp32 oneDNN: 8.7 / 30.2 /
#   36.8 at 1 row, 28.1 / 51.6 / 50.2 at 8, 54.3 / 70.0 / 64.6 at 16, 88.9 / 116.1 / 105.7 at
#   32, 156.9 / 183.8 / 164.5 at 64, 225.5 / 244.6 / 229.5 at 96, 302.1 / 315.5 / 283.3 at 128;
#   on 35 projections 104.0 / 98.6 at 256 and 234.7 / 195.8 at 512. The GEMM from 64, not from
#   128-256 where the tile stops being ahead here: the tile reads all of x per 3 weight rows,
#   and past 64 rows x outgrows a 512 KB L2 (Zen 1's) at k = 1,536. int8 weights on AVX2
#   (`int8_linear` in native ymm since then; quant_linear_avx2_int8*.json), kernel / fp32
#   oneDNN / Q4_1 dequantize + GEMM: 11.4 ms at 1 row (44.2 before), 14.1 at 4, 54.1 / 77.0 /
#   83.1 at 16, 105.6 / 105.5 / 111.6 at 32, 211.7 / 170.6 / 181.7 at 64: the GEMM from 32.
# `GemmRows.kmajor`: the same for GGUF blocks stored k-major (`QuantWeight.kmajor`), whose kernel on
# AVX-512 has dequantized 4 blocks of a group at a time into a 16 KB tile from 32 rows since
# 2026-12-07 (kernels/cpu_gguf_kmajor_avx512.h). The bundled file's 210 Q4_1 projections, 2 threads,
# wall ms, Zen 4 (`quant_linear.py --systems q4_1_kmajor q4_1@float32 fp32_onednn`; BENCHMARKS.md,
# "A tile for k-major blocks"), the tile / dequantize + GEMM (the engine's path from 80 rows until
# then) / fp32 oneDNN on packed weights: 85.2 / 132.5 / 95.9 at 80 rows, 133.8 / 176.2 / 138.4 at
# 128, 271.4 / 301.7 / 264.3 at 256, 548.3 / 586.1 / 560.7 at 512, 1105.5 / 1065.3 / 1047.6 at
# 1,024. So the GEMM from 1,024 rows, past the default step budget (`max_num_batched_tokens`, 512):
# there a projection computes each row with the same FMAs in the same order whatever the step's
# other rows. AVX2's k-major tile (one block, passes of 6 rows x 16 columns), the haswell build with
# MKL and oneDNN held to AVX2 on the same Zen 4, same bench, tile / dequantize + GEMM from the
# file's layout, two runs: 82.3 / 113.5 and 170.0 / 237.6 at 64 rows, 162.6 / 205.1 and 216.0 /
# 311.7 at 128, 331.3 / 333.0 and 475.5 / 486.6 at 256, 729.0 / 641.8 and 1104.1 / 951.9 at 512: the
# GEMM from 256 (was 64).
GEMM_MIN_ROWS = {
    "avx512": GemmRows(gguf=80, kmajor=1024, int8=384),
    "avx2": GemmRows(gguf=64, kmajor=256, int8=384),
}
ANY_ROWS = 1 << 30  # a row count past any step's
# `--quant-activations int8` rounds x to 8 bits for GGUF blocks (`gguf_linear_q8`) at every row
# count: from a few rows (3-6, `gemm_min_rows` in kernels/cpu_gguf_q8.cpp) its panel GEMM
# (kernels/cpu_q8_gemm.h) beats both exact paths for 4-bit blocks on either ISA. (AVX2's exact
# registers were ahead at 3-4 rows, 14.3 / 17.5 ms at 4, until AVX2's panels were stored at load
# too: 8.4 ms; the haswell build on a Zen 4, 2026-12-06.) Q8_0 blocks
# on AVX-512 are the exception: exact 12.9 / a8 17.1 ms at 3 rows, 17.5 / 21.1 at 8, 31.3 /
# 28.6 at 16 (AMX Xeon, 2026-12-05). Same bench, exact gguf_linear / best exact /
# gguf_linear_q8:
# - AVX-512 VNNI (Xeon, 2026-12-04; ops/bench/results/quant-a8-1204/): 11.1 / 7.7 at 1 row,
#   19.2 / 18.9 at 8, 35.6 / 25.5 at 16, 142.4 / 74.6 at 64 (fp32 oneDNN 130.0), 293.2 / 142.4
#   at 128 (228.3).
# - AVX2 (Zen 3): 31.6 / 9.0 at 1 row, 175.6 / 73.6 / 38.0 at 8, 653.9 / 129.3 / 74.6 at 32,
#   1311.0 / 199.3 / 141.4 at 64, 2684.2 / 345.2 / 293.9 at 128 (fp32 oneDNN 373.7); before the
#   AVX2 GEMM its one-row kernel took 45.3, 171.5, 370.6 and 695.1 there.
# Rows from which `--quant-activations bfloat16` multiplies GGUF blocks in bfloat16: the weight
# dequantized to bf16 for the call, x rounded to bf16, oneDNN's bf16 GEMM (AMX tiles where the
# CPU has them), fp32 out. One layer's 7 Q4_1 projections of the bundled file, 2 threads, AMX
# Xeon, 2026-12-05, exact path / bf16 (ms, best of 7): 1.87 / 2.25 at 32 rows, 2.77 / 2.44 at
# 48, 3.84 / 2.52 at 64, 8.15 / 3.14 at 128, 13.8 / 4.24 at 256, 24.0 / 6.23 at 512. Zen 4
# (AVX-512 BF16, no AMX; 210 projections, 1 thread, CPU ms): 80.1 at 48, 97.2 at 64, 160.1 at
# 128 against the exact path's 130.6, 174.1, 326.4, and int8's GEMM ahead of both (67.4, 80.7,
# 142.4 with gathered panels; 69.5 at 64 rows and 131.0 at 128 with transposed ones). Without
# oneDNN's bf16 support (`bf16_gemm_supported`: AVX2) it is emulated at 4.5x the exact path's
# time (Zen 3: 1474.6 against 326.9 ms at 64 rows), so there the steps stay exact.
# Since the weight is dequantized straight to bf16 (`gguf_dequantize(..., bf16=True)`, not
# fp32 and then `.to`), bf16 / exact on the AMX Xeon (210 projections, 1 thread, CPU ms,
# 2026-12-05): 67.0 / 69.1 at 32 rows, 63.1 / 97.9 at 48, 83.4 / 181.1 at 128 (84.1, 116.1
# before at 48 and 128). 48 stays: clear of the tie at 32.
BF16_GEMM_MIN_ROWS = 48
# With int8+bfloat16, bf16 replaces int8's panel GEMM instead, which holds out longer. Q4_1 a8 /
# bf16, same bench: 41.0 / 67.0 at 32 rows, 69.0 / 68.4 at 64, 70.4 / 72.2 at 72, 81.6 / 68.7
# at 80, 94.4 / 79.3 at 96, 114.4 / 83.4 at 128, 226.4 / 119.2 at 256. Only AMX's tiles get
# there (`amx_supported`): on a Zen 4 (AVX-512 BF16, no AMX; same bench, 2026-12-05,
# ops/bench/results/zen4-1205/) int8 stayed ahead at every row count, 80.7 / 115.5 at 80 rows,
# 126.2 / 163.3 at 128, 283.2 / 291.3 at 256, and on 35 projections 75.0 / 92.6 at 512 and
# 167.1 / 186.3 at 1024; there int8+bfloat16 is int8 at every row count.
BF16_OVER_INT8_MIN_ROWS = 80
# Largest weight (as fp32) that path dequantizes: past glibc's 32 MiB mmap threshold each call's
# buffer is a fresh mapping, page-faulted in. The tied Q8_0 head (49,152 x 576, 113 MB as fp32)
# took 129 ms that way at 64 rows where `gguf_linear` took 41 (204 / 221 ms at 256 rows).
GEMM_MAX_BYTES = 32 << 20


def dense_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ w.T + bias`` for a transient float32 weight. On AMD CPUs through oneDNN, the weight
    as it is (no reorder): torch's `F.linear` calls MKL's sgemm, which there runs without
    AVX-512. Zen 5 EPYC, 2 threads, GFLOP/s, `F.linear` / oneDNN: 211 / 494 at 512 x 576 x 1536,
    205 / 452 at 128 rows, 202 / 198 at 96 x 576 x 192 (2026-12-06). Intel keeps MKL, which the
    thresholds above were measured with."""
    if x.dtype == torch.float32 and w.dtype == torch.float32 and _onednn_plain():
        return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")
    return torch.nn.functional.linear(x, w, bias)


@functools.cache
def _onednn_plain() -> bool:
    from worker.models.cpu_vendor import cpu_vendor

    return cpu_vendor() == "AuthenticAMD" and torch.backends.mkldnn.is_available()


def bf16_gemm_supported() -> bool:
    """Whether oneDNN multiplies bf16 on this CPU (AVX-512 or AMX; torch's own check), where
    `BF16_GEMM_MIN_ROWS` pays."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return check is not None and bool(check())


def amx_supported() -> bool:
    """Whether the CPU has AMX tiles (torch's cpuinfo check), where oneDNN's bf16 GEMM
    overtakes int8's panel GEMM (`BF16_OVER_INT8_MIN_ROWS`)."""
    check = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return check is not None and bool(check())


def avx512_bf16_supported() -> bool:
    """Whether the CPU has AVX-512 BF16's dot products (vdpbf16ps; Zen 4 and later, Cooper Lake
    and later), which our bf16 prefill attention uses where AMX is missing."""
    check = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return check is not None and bool(check())
