// The k-major kernels' AVX-512 parts (cpu_gguf_kmajor.cpp): all 32 columns of a group a pass.
#pragma once

#include "cpu_gguf_kmajor.h"

namespace paternoster {
namespace kmajor {
// Internal linkage, as in the one file that includes this: the passes and readers then inline
// into linear_groups (with external linkage the AVX2 passes took 27.9 ms at 8 rows, not 17.8:
// quant_linear.py, 210 Q4_1 projections, 1 thread, Zen 5, 2026-12-07).
namespace {

#if defined(__AVX512F__)
constexpr int64_t kMaxRows = 12;  // rows of x a pass: 24 accumulators, 2 weights, x broadcast

// A group's block, all 32 columns: two zmm of weights a k.
template <int64_t F>
struct GroupBlock {
    __m512 d[2], m[2];
    const uint8_t* lines;
    explicit GroupBlock(const uint8_t* p) : lines(p + 2 * Layout<F>::kHeads * kCols) {
        const auto* h = reinterpret_cast<const __m256i*>(p);
        for (int j = 0; j < 2; ++j) {
            d[j] = _mm512_cvtph_ps(_mm256_loadu_si256(h + j));
            if constexpr (F == kQ4_1) m[j] = _mm512_cvtph_ps(_mm256_loadu_si256(h + 2 + j));
            if constexpr (F == kQ4_0) m[j] = _mm512_mul_ps(d[j], _mm512_set1_ps(-8.0f));
        }
    }
    // k's 32 weights: columns 0-15 in w[0], 16-31 in w[1].
    void weights(int64_t k, __m512 (&w)[2]) const {
        if constexpr (F == kQ8_0) {
            for (int j = 0; j < 2; ++j) {
                const __m512i q = _mm512_cvtepi8_epi32(load16(lines + k * 32 + 16 * j));
                w[j] = _mm512_mul_ps(_mm512_cvtepi32_ps(q), d[j]);
            }
        } else {
            const __m512i v = _mm512_cvtepu8_epi32(load16(lines + k * 16));
            const __m512i q0 = _mm512_and_si512(v, _mm512_set1_epi32(15));
            const __m512i q1 = _mm512_srli_epi32(v, 4);
            w[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q0), d[0], m[0]);
            w[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q1), d[1], m[1]);
        }
    }
};

// out[r * ldo + c] = x row r . column c of the group, for R rows of x.
template <int64_t R, int64_t F>
void group_pass(const float* x, int64_t ldx, const uint8_t* group, int64_t nb, float* out,
                int64_t ldo) {
    __m512 acc[R][2];
    for (int64_t r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = group + b * Layout<F>::kGroupBlock;
        prefetch_ahead<F>(p);
        const GroupBlock<F> block(p);
        const float* xb = x + b * kBlock;
        for (int64_t k = 0; k < kBlock; ++k) {
            __m512 w[2];
            block.weights(k, w);
            for (int64_t r = 0; r < R; ++r) {
                const __m512 xv = _mm512_set1_ps(xb[r * ldx + k]);
                acc[r][0] = _mm512_fmadd_ps(xv, w[0], acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(xv, w[1], acc[r][1]);
            }
        }
    }
    for (int64_t r = 0; r < R; ++r) {
        _mm512_storeu_ps(out + r * ldo, acc[r][0]);
        _mm512_storeu_ps(out + r * ldo + 16, acc[r][1]);
    }
}

// A group's block as fp32 [k][column], the file's dequantized bits.
template <int64_t F>
void block_tile(const uint8_t* p, float (*tile)[kCols]) {
    const GroupBlock<F> block(p);
    for (int64_t i = 0; i < kBlock; ++i) {
        __m512 w[2];
        block.weights(i, w);
        _mm512_store_ps(tile[i], w[0]);
        _mm512_store_ps(tile[i] + 16, w[1]);
    }
}
#endif

}  // namespace
}  // namespace kmajor
}  // namespace paternoster
