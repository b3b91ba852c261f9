// GGUF blocks stored k-major at load (kernels/quant_reference.py `pack_kmajor`) and their
// readers, for kernels/cpu_gguf_kmajor.cpp. Per group of 32 weight rows (output columns) and
// block: the rows' 32 d (fp16), Q4_1's 32 m, then for each of the block's 32 k one line of the
// rows' codes: 16 bytes for 4-bit formats (column c's in byte c % 16, low nibble for c < 16,
// high for c >= 16), 32 for Q8_0 (column c's int8 in byte c). The file's bytes a block a row.
// A reader turns a k's line into the columns' fp32 weights as the file dequantizes them
// (quant_reference.dequantize): fma(q, d, m) rounds once, and so does Q4_0's (q - 8) * d as
// fma(q, d, -8 d) and Q8_0's q * d.
#pragma once

#include "cpu_quant.h"

namespace paternoster {
namespace kmajor {

using namespace quant;

constexpr int64_t kCols = 32;  // output columns a group

template <int64_t F>
struct Layout {
    static constexpr int64_t kHeads = F == kQ4_1 ? 2 : 1;   // fp16 fields a column: d (and m)
    static constexpr int64_t kLine = F == kQ8_0 ? 32 : 16;  // bytes of one k's codes
    static constexpr int64_t kGroupBlock = 2 * kHeads * kCols + kBlock * kLine;
    static_assert(kGroupBlock == kCols * block_bytes(F), "the file's bytes, rearranged");
};

#if defined(__AVX512F__)
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
#elif defined(__AVX2__)
// The H-th 16 columns of a group's block (16 ymm registers cannot hold a group's 32 d and m
// beside more than one row's accumulators): for 4-bit formats the low nibbles (H = 0) or the
// high ones (H = 1) of each k's line, for Q8_0 its bytes 16 H to 16 H + 15.
template <int H, int64_t F>
struct HalfBlock {
    __m256 d[2], m[2];
    const uint8_t* lines;
    explicit HalfBlock(const uint8_t* p) : lines(p + 2 * Layout<F>::kHeads * kCols) {
        const auto* h = reinterpret_cast<const __m128i*>(p) + 2 * H;  // 8 fp16 a __m128i
        for (int j = 0; j < 2; ++j) {
            d[j] = _mm256_cvtph_ps(_mm_loadu_si128(h + j));
            if constexpr (F == kQ4_1) m[j] = _mm256_cvtph_ps(_mm_loadu_si128(h + 4 + j));
            if constexpr (F == kQ4_0) m[j] = _mm256_mul_ps(d[j], _mm256_set1_ps(-8.0f));
        }
    }
    // k's 16 weights: the half's columns 0-7 in w[0], 8-15 in w[1].
    void weights(int64_t k, __m256 (&w)[2]) const {
        for (int j = 0; j < 2; ++j) {
            if constexpr (F == kQ8_0) {
                const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                    reinterpret_cast<const __m128i*>(lines + k * 32 + 16 * H + 8 * j)));
                w[j] = _mm256_mul_ps(_mm256_cvtepi32_ps(q), d[j]);
            } else {
                const __m256i v = _mm256_cvtepu8_epi32(
                    _mm_loadl_epi64(reinterpret_cast<const __m128i*>(lines + k * 16 + 8 * j)));
                const __m256i q = H == 0 ? _mm256_and_si256(v, _mm256_set1_epi32(15))
                                         : _mm256_srli_epi32(v, 4);
                w[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), d[j], m[j]);
            }
        }
    }
};
#endif

}  // namespace kmajor
}  // namespace paternoster
