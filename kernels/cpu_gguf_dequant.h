// A GGUF block's weights as floats, in registers or into a row of memory: the exact kernels'
// one dequantization (cpu_quant_linear.cpp's registers and `gguf_dequantize`, the tiles of
// cpu_gguf_tile.h), the math of kernels/quant_reference.py `dequantize`.
#pragma once

#include "cpu_quant.h"

namespace paternoster {
namespace quant {

// The block's 32 weights as (elements 0-15, elements 16-31).
template <int64_t F>
inline void dequant(const uint8_t* b, f16v& lo, f16v& hi) {
    const float d = half(b);
    const f16v dv = splat(d);
    if constexpr (F == kQ8_0) {
        lo = widen(load16(b + 2), true) * dv;
        hi = widen(load16(b + 18), true) * dv;
    } else {
        const float m = F == kQ4_1 ? half(b + 2) : -8.0f * d;
#if defined(__AVX512F__)
        // A 4-bit code has 16 values: the block's 16 weights d * q + m are one FMA, and each
        // half of the block a permute of them by its codes (vpermps reads an index's low 4
        // bits, so the low nibbles need no mask). The same bits as below: d * q is exact in
        // fp32 and one rounding follows either way. In place of a mask, a shift, two widenings
        // to int32, two conversions and two FMAs a block: on a Zen 4 (1 thread, the bundled
        // file's 210 Q4_1 projections) 8.8-11.5 -> 7.6-7.9 ms at 1 row, a single stream 1.07x;
        // from 4 rows the FMAs set the time (BENCHMARKS.md, 2026-12-07).
        const __m512 table = _mm512_fmadd_ps(
            _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_ps(d), _mm512_set1_ps(m));
        const __m512i codes = _mm512_cvtepu8_epi32(load16(b + (F == kQ4_1 ? 4 : 2)));
        lo = f16v(_mm512_permutexvar_ps(codes, table));
        hi = f16v(_mm512_permutexvar_ps(_mm512_srli_epi32(codes, 4), table));
#else
        const f16v mv = splat(m);
        const __m128i q = load16(b + (F == kQ4_1 ? 4 : 2)), low4 = _mm_set1_epi8(0x0F);
        lo = widen(_mm_and_si128(q, low4), false) * dv + mv;
        hi = widen(_mm_and_si128(_mm_srli_epi16(q, 4), low4), false) * dv + mv;
#endif
    }
}

#if !defined(__AVX512F__)
// A block's 32 weights as four ymm (elements 0-7, 8-15, 16-23, 24-31), for AVX2 builds: there
// the 16-float vectors above are two ymm each, and gcc kept the register path's accumulators on
// the stack and moved them through general registers every block (cpu_gguf_avx2.cpp).
template <int64_t F>
inline void dequant_ymm(const uint8_t* b, __m256 (&wv)[4]) {
    const __m256 d = _mm256_set1_ps(half(b));
    __m128i lo, hi;  // bytes of elements 0-15 and 16-31
    if constexpr (F == kQ8_0) {
        lo = load16(b + 2), hi = load16(b + 18);
    } else {
        const __m128i q = load16(b + (F == kQ4_1 ? 4 : 2)), low4 = _mm_set1_epi8(0x0F);
        lo = _mm_and_si128(q, low4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), low4);
    }
    const __m128i bytes[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int64_t j = 0; j < 4; ++j) {
        const __m256i i32 =
            F == kQ8_0 ? _mm256_cvtepi8_epi32(bytes[j]) : _mm256_cvtepu8_epi32(bytes[j]);
        const __m256 q = _mm256_cvtepi32_ps(i32);
        // The same bits as dequantize's d * q + m: d * q (11 x 8 bits at most) is exact in
        // fp32, so fusing the add rounds once, as the unfused add does.
        if constexpr (F == kQ8_0)
            wv[j] = _mm256_mul_ps(q, d);
        else if constexpr (F == kQ4_1)
            wv[j] = _mm256_fmadd_ps(q, d, _mm256_set1_ps(half(b + 2)));
        else
            wv[j] = _mm256_fmadd_ps(q, d, _mm256_mul_ps(d, _mm256_set1_ps(-8.0f)));
    }
}
#endif

// A row of nb blocks into dst (nb * 32 floats): the tiles' fill and `gguf_dequantize`.
template <int64_t F>
inline void dequant_row(const uint8_t* src, int64_t nb, float* dst) {
    for (int64_t b = 0; b < nb; ++b) {
#if defined(__AVX512F__)
        f16v lo, hi;
        dequant<F>(src + b * block_bytes(F), lo, hi);
        std::memcpy(dst + b * kBlock, &lo, sizeof(lo));
        std::memcpy(dst + b * kBlock + 16, &hi, sizeof(hi));
#else
        __m256 wv[4];
        dequant_ymm<F>(src + b * block_bytes(F), wv);
        for (int64_t j = 0; j < 4; ++j) _mm256_storeu_ps(dst + b * kBlock + 8 * j, wv[j]);
#endif
    }
}

}  // namespace quant
}  // namespace paternoster
