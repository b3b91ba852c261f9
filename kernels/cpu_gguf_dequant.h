// A GGUF block's weights as floats, in registers or into a row of memory: the exact kernels'
// one dequantization (cpu_quant_linear.cpp's registers and `gguf_dequantize`, the tiles of
// cpu_gguf_tile.h), the math of kernels/quant_reference.py `dequantize`.
#pragma once

#include "cpu_quant.h"

namespace paternoster {
namespace quant {

// The block's 32 weights as (elements 0-15, elements 16-31), from its scale d, Q4_1's min m
// (Q4_0's is -8 d; Q8_0 has none) and its code bytes: Q8_0's 32 in (q0, q1), a 4-bit block's
// 16 in q0 (element j's code in byte j's low nibble, element j + 16's in its high one).
template <int64_t F>
inline void dequant_codes(float d, float m, __m128i q0, __m128i q1, f16v& lo, f16v& hi) {
    if constexpr (F == kQ8_0) {
        const f16v dv = splat(d);
        lo = widen(q0, true) * dv;
        hi = widen(q1, true) * dv;
    } else {
        if constexpr (F == kQ4_0) m = -8.0f * d;
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
        const __m512i codes = _mm512_cvtepu8_epi32(q0);
        lo = f16v(_mm512_permutexvar_ps(codes, table));
        hi = f16v(_mm512_permutexvar_ps(_mm512_srli_epi32(codes, 4), table));
#else
        const f16v dv = splat(d), mv = splat(m);
        const __m128i low4 = _mm_set1_epi8(0x0F);
        lo = widen(_mm_and_si128(q0, low4), false) * dv + mv;
        hi = widen(_mm_and_si128(_mm_srli_epi16(q0, 4), low4), false) * dv + mv;
#endif
        (void)q1;
    }
}

// The same for a block in the file's layout at b (its head, then its codes).
template <int64_t F>
inline void dequant(const uint8_t* b, f16v& lo, f16v& hi) {
    const float m = F == kQ4_1 ? half(b + 2) : 0.0f;
    const uint8_t* codes = b + (F == kQ4_1 ? 4 : 2);
    const __m128i q1 = F == kQ8_0 ? load16(codes + 16) : _mm_setzero_si128();
    dequant_codes<F>(half(b), m, load16(codes), q1, lo, hi);
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

// A row of nb blocks into dst (nb * 32 floats), block b's bytes in the file's layout at
// `block(b)`: the tiles' fill and `gguf_dequantize`.
template <int64_t F, class Block>
inline void dequant_blocks(Block block, int64_t nb, float* dst) {
    for (int64_t b = 0; b < nb; ++b) {
#if defined(__AVX512F__)
        f16v lo, hi;
        dequant<F>(block(b), lo, hi);
        std::memcpy(dst + b * kBlock, &lo, sizeof(lo));
        std::memcpy(dst + b * kBlock + 16, &hi, sizeof(hi));
#else
        __m256 wv[4];
        dequant_ymm<F>(block(b), wv);
        for (int64_t j = 0; j < 4; ++j) _mm256_storeu_ps(dst + b * kBlock + 8 * j, wv[j]);
#endif
    }
}

// A row of nb blocks of the file's layout into dst.
template <int64_t F>
inline void dequant_row(const uint8_t* src, int64_t nb, float* dst) {
    dequant_blocks<F>([src](int64_t b) { return src + b * block_bytes(F); }, nb, dst);
}

// Where a panel of `rows` weight rows stored as kernels/quant_reference.py `pack_panels` stores
// them keeps a block's bytes: per block, the rows' 4-byte code words word by word, row after
// row, then the rows' heads (cpu_q8_gemm.h's StoredPanel, with its rows a compile-time count,
// reads the same bytes a word of every row at once).
template <int64_t F>
struct PanelBlocks {
    static constexpr int64_t kWords = F == kQ8_0 ? 8 : 4;  // code words a block row
    static constexpr int64_t kHead = block_bytes(F) - 4 * kWords;
    const uint8_t* panel;
    int64_t rows;
    const uint8_t* block(int64_t b) const { return panel + b * rows * block_bytes(F); }
    // Row i's word w of block b; the rows' words w lie side by side from row 0's.
    const uint8_t* word(int64_t b, int64_t w, int64_t i) const {
        return block(b) + (w * rows + i) * 4;
    }
    const uint8_t* head(int64_t b, int64_t i) const {
        return block(b) + rows * 4 * kWords + i * kHead;
    }
};

// Row i of a panel of `panel_rows` stored rows (`PanelBlocks`) into dst: AVX2 builds' path
// (AVX-512 builds take `dequant_panel_rows4`). Each block is put back in the file's layout in a
// 34-byte buffer: its head by one store, its codes by one 16-byte store per 4 words (the row's
// words loaded into one vector), which the block's loads then read whole, as the store wrote
// them. Gathering a panel's rows first with a 4-byte
// copy a word took 1.3x the file's time for Q4_1 and 2.2x for Q8_0; this way 1.3-1.5x
// (1,536 x 576 to bf16, 1 thread, AMX Xeon's native build).
template <int64_t F>
inline void dequant_panel_row(const uint8_t* panel, int64_t panel_rows, int64_t i, int64_t nb,
                              float* dst) {
    using P = PanelBlocks<F>;
    const P p{panel, panel_rows};
    alignas(16) uint8_t block[block_bytes(F)];
    dequant_blocks<F>(
        [&](int64_t b) {
            std::memcpy(block, p.head(b, i), P::kHead);
            for (int64_t w = 0; w < P::kWords; w += 4) {
                const __m128i codes = _mm_setr_epi32(load32(p.word(b, w, i)),
                                                     load32(p.word(b, w + 1, i)),
                                                     load32(p.word(b, w + 2, i)),
                                                     load32(p.word(b, w + 3, i)));
                _mm_storeu_si128(reinterpret_cast<__m128i*>(block + P::kHead + 4 * w), codes);
            }
            return static_cast<const uint8_t*>(block);
        },
        nb, dst);
}

#if defined(__AVX512F__)
// Rows i0 to i0 + 3 of a panel of `panel_rows` rows (as `dequant_panel_row` reads one) into
// dst[0..3], each block's codes straight from registers: the 4 rows' words w lie side by side
// (16 bytes), so 4 loads and a 4 x 4 transpose of dwords give each row's codes in the file's
// order. 1,536 x 576 to bf16, 1 thread, AMX Xeon: 1.04-1.2x the file's layout's time, where
// `dequant_panel_row` took 1.3-1.5x; a whole bf16 call of the bundled file's 210 Q4_1
// projections at 512 rows, 2 threads, within 2% of the file's layout (BENCHMARKS.md).
template <int64_t F>
inline void dequant_panel_rows4(const uint8_t* panel, int64_t panel_rows, int64_t i0, int64_t nb,
                                float* const (&dst)[4]) {
    using P = PanelBlocks<F>;
    const P p{panel, panel_rows};
    for (int64_t b = 0; b < nb; ++b) {
        __m128i q[2][4];  // [word group][row]
        for (int64_t g = 0; g < P::kWords / 4; ++g) {
            __m128i v[4];
            for (int64_t w = 0; w < 4; ++w) v[w] = load16(p.word(b, 4 * g + w, i0));
            const __m128i t0 = _mm_unpacklo_epi32(v[0], v[1]), t1 = _mm_unpacklo_epi32(v[2], v[3]);
            const __m128i t2 = _mm_unpackhi_epi32(v[0], v[1]), t3 = _mm_unpackhi_epi32(v[2], v[3]);
            q[g][0] = _mm_unpacklo_epi64(t0, t1);
            q[g][1] = _mm_unpackhi_epi64(t0, t1);
            q[g][2] = _mm_unpacklo_epi64(t2, t3);
            q[g][3] = _mm_unpackhi_epi64(t2, t3);
        }
        for (int64_t j = 0; j < 4; ++j) {
            const uint8_t* h = p.head(b, i0 + j);
            f16v lo, hi;
            dequant_codes<F>(half(h), F == kQ4_1 ? half(h + 2) : 0.0f, q[0][j],
                             q[P::kWords / 4 - 1][j], lo, hi);
            std::memcpy(dst[j] + b * kBlock, &lo, sizeof(lo));
            std::memcpy(dst[j] + b * kBlock + 16, &hi, sizeof(hi));
        }
    }
}
#endif

}  // namespace quant
}  // namespace paternoster
