// y = x @ W.T + b, W held as GGUF blocks (Q8_0, Q4_0, Q4_1) in the file's own layout: a
// (n, row_bytes) uint8 tensor. Layouts and math: kernels/quant_reference.py.
//
// A decode step reads every weight once, so bytes per weight set its time: SmolLM2-135M's
// projections are 425 MB in fp32, 66 MB in Q4_1. Below tile_min_rows rows of x, each block of
// kGgufOut weight rows is dequantized into registers (two 16-float vectors a row: its low and
// high nibbles, or its 32 int8) and multiplied into kRows rows of x while there (8 x 3
// accumulators on AVX-512), so a block is dequantized once per kRows rows. On a Zen 5 EPYC (1
// thread, the file's 210 Q4_1 projections) this replaced passes of 4 rows x 2 weight rows and,
// past 16 rows, an fp32 tile per weight-row pair: 16 rows 35.8 -> 20.0 ms, 32 rows 83.4 -> 41.0
// (oneDNN fp32 40.8), 64 rows 84 where that tile took 102 (BENCHMARKS.md, issue 23). From
// `tile_min_rows` (10 for 4-bit blocks, 16 for Q8_0), a tile of 4 weight rows (cpu_gguf_tile.h)
// against 6 rows of x at a time: on an AMX Xeon the passes' dequantizing made these registers
// 3.1 ms a row of x past 16 rows, and the tile took 32 rows 107.2 -> 84.5 ms, 64 rows 227.2 ->
// 146.7 (dequantize + oneDNN's GEMM 171.7; BENCHMARKS.md, "The exact GGUF tile on AVX-512").
// AVX2 builds run cpu_gguf_avx2.cpp's (gcc keeps these 16-float vectors in memory there).

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_gguf_tile.h"

namespace paternoster {
namespace {

using namespace quant;

// out[r * ldo + o] for R rows of x and O weight rows of `nb` blocks each (`ldw` bytes apart).
template <int64_t F, int64_t R, int64_t O>
void gguf_block(const float* x, int64_t ldx, const uint8_t* w, int64_t ldw, int64_t nb,
                float* out, int64_t ldo) {
    f16v acc[R][O] = {};
    for (int64_t b = 0; b < nb; ++b) {
        f16v lo[O], hi[O];
        for (int64_t o = 0; o < O; ++o) {
            // The next O rows, as fast as these are read (as skinny_linear does): without it,
            // 1 thread on a Zen 4 EPYC read 113 MB of Q8_0 at 6.9 GB/s (12.1 with it).
            __builtin_prefetch(w + (O + o) * ldw + b * block_bytes(F));
            dequant<F>(w + o * ldw + b * block_bytes(F), lo[o], hi[o]);
        }
        for (int64_t r = 0; r < R; ++r) {
            const float* xr = x + r * ldx + b * kBlock;
            const f16v xl = loadf(xr), xh = loadf(xr + 16);
            for (int64_t o = 0; o < O; ++o) {
                acc[r][o] += xl * lo[o];  // two FMAs (one expression was a mul, an FMA, an add)
                acc[r][o] += xh * hi[o];
            }
        }
    }
    for (int64_t r = 0; r < R; ++r)
        for (int64_t o = 0; o < O; ++o) out[r * ldo + o] = hsum(acc[r][o]);
}

// O weight rows against all rows of x, in passes of kRows rows (each block dequantized once a
// pass).
template <int64_t F, int64_t O>
void gguf_rows(const float* x, int64_t ldx, int64_t rows, const uint8_t* w, int64_t ldw,
               int64_t nb, float* out, int64_t ldo) {
    in_passes<kRows>(rows, [&](int64_t r, auto n) {
        gguf_block<F, decltype(n)::value, O>(x + r * ldx, ldx, w, ldw, nb, out + r * ldo, ldo);
    });
}

constexpr int64_t kGgufOut = 3;  // 8 x 3 accumulators, 6 weight, x of 32 zmm (32 rows: 56 -> 41 ms)

// The last n % kGgufOut weight rows (fewer than a group), one group of their own size.
template <int64_t F, int64_t O = kGgufOut - 1>
void gguf_tail(int64_t left, const float* x, int64_t ldx, int64_t rows, const uint8_t* w,
               int64_t ldw, int64_t nb, float* out, int64_t ldo) {
    if (left == O)
        gguf_rows<F, O>(x, ldx, rows, w, ldw, nb, out, ldo);
    else if constexpr (O > 1)
        gguf_tail<F, O - 1>(left, x, ldx, rows, w, ldw, nb, out, ldo);
}

template <int64_t F>
void gguf_all(const float* x, int64_t ldx, int64_t rows, const uint8_t* w, int64_t n,
              int64_t nb, float* out) {
#if !defined(__AVX512F__)
    gguf_linear_avx2(x, ldx, rows, w, n, nb, F, out);  // the 16-float vectors here are AVX-512's
#else
    if (rows >= tile_min_rows(F))  // each block dequantized once, not once per pass of kRows
        return gguf_tiled<F>(x, ldx, rows, w, n, nb, out);
    const int64_t ldw = nb * block_bytes(F);
    // Threads split the weight rows, so each streams its part of W once; grain 16 groups keeps
    // the smallest projection here (192 rows of k/v) on 2+ threads.
    at::parallel_for(0, (n + kGgufOut - 1) / kGgufOut, 16, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
            const int64_t o0 = p * kGgufOut;
            const uint8_t* wp = w + o0 * ldw;
            if (o0 + kGgufOut <= n)
                gguf_rows<F, kGgufOut>(x, ldx, rows, wp, ldw, nb, out + o0, n);
            else
                gguf_tail<F>(n - o0, x, ldx, rows, wp, ldw, nb, out + o0, n);
        }
    });
#endif
}

}  // namespace

at::Tensor gguf_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t format,
                       const c10::optional<at::Tensor>& bias) {
    return gguf_call(x, blocks, format, bias,
                     [](int64_t f, const float* xp, int64_t ldx, int64_t rows, const uint8_t* wp,
                        int64_t n, int64_t nb, float* op) {
                         with_format(f, [&](auto F) {
                             gguf_all<decltype(F)::value>(xp, ldx, rows, wp, n, nb, op);
                         });
                     });
}

std::string quant_isa() {
#if defined(__AVX512F__)
    return "avx512";
#else
    return "avx2";
#endif
}

namespace {

// float -> bfloat16 as c10::BFloat16 (torch's `.to`) converts: round to nearest even, any NaN to
// the quiet 0x7FC0. Plain integer ops and a select, which gcc vectorises. c10's own scalar
// conversion (element by element) made `q4_1@bfloat16` 78.2 ms at 48 rows in one run, against
// 63.2-70.7 in three with this loop (quant_linear.py, 1 thread; at 128 rows 91.8 / 91.3-96.4).
void to_bf16(const float* src, int64_t n, at::BFloat16* dst) {
    for (int64_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &src[i], sizeof(bits));
        const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
        dst[i].x = uint16_t((bits & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded);
    }
}

}  // namespace

at::Tensor gguf_dequantize(const at::Tensor& blocks, int64_t format, bool bf16,
                           int64_t panel_rows) {
    const int64_t nb = checked_blocks(blocks, format), n = blocks.size(0), k = nb * kBlock;
    TORCH_CHECK(panel_rows >= 0 && (panel_rows == 0 || n % panel_rows == 0),
                "panel_rows must be 0 or divide the ", n, " weight rows");
    at::Tensor out = at::empty({n, k}, blocks.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
    const uint8_t* wp = blocks.data_ptr<uint8_t>();
    float* op = bf16 ? nullptr : out.data_ptr<float>();
    at::BFloat16* hp = bf16 ? out.data_ptr<at::BFloat16>() : nullptr;
    const int64_t ldw = nb * block_bytes(format);
    // Stored panels (`panel_rows`): each row's blocks read from where its panel keeps them,
    // 4 rows at a time in AVX-512 builds (their panels are 16 rows).
#if defined(__AVX512F__)
    constexpr int64_t kRows = 4;
#else
    constexpr int64_t kRows = 1;
#endif
    const int64_t step = panel_rows > 0 && panel_rows % kRows == 0 ? kRows : 1;
    const int64_t panel_bytes = panel_rows * ldw;
    at::parallel_for(0, n / step, 16 / step, [&](int64_t begin, int64_t end) {
        // bf16: each row in fp32 here first (6 KB at k = 1536, in L1), never the whole weight:
        // dequantize-then-`.to` wrote and read a 4-byte copy of every weight (7 MB a call).
        thread_local std::vector<float> rows;
        if (bf16) rows.resize(kRows * k);
        for (int64_t t = begin; t < end; ++t) {
            const int64_t o = t * step;
            float* dst[kRows];
            for (int64_t j = 0; j < step; ++j) dst[j] = bf16 ? &rows[j * k] : op + (o + j) * k;
            with_format(format, [&](auto F) {
                constexpr int64_t f = decltype(F)::value;
                if (!panel_rows) return dequant_row<f>(wp + o * ldw, nb, dst[0]);
                const uint8_t* panel = wp + o / panel_rows * panel_bytes;
#if defined(__AVX512F__)
                if (step == kRows)
                    return dequant_panel_rows4<f>(panel, panel_rows, o % panel_rows, nb, dst);
#endif
                dequant_panel_row<f>(panel, panel_rows, o % panel_rows, nb, dst[0]);
            });
            if (bf16)
                for (int64_t j = 0; j < step; ++j) to_bf16(dst[j], k, hp + (o + j) * k);
        }
    });
    return out;
}

}  // namespace paternoster
