// The vector primitives of gguf_linear_q8's one-row-per-vector kernel (cpu_gguf_q8.cpp), per
// ISA: a step of two blocks in a zmm with VNNI, one block in a ymm with AVX2's maddubs. The
// float side (Vec, kLanes: a step's int32 lanes, 8 a block) is cpu_float_vec.h's of that width.
#pragma once

#include "cpu_float_vec.h"
#include "cpu_quant.h"

namespace paternoster {
namespace q8 {

using namespace quant;

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
constexpr int64_t kStep = 2;  // blocks a step
constexpr int64_t kQRows = 4, kQOut = 3;  // 12 accumulators + 9 weight vectors of 32 zmm
constexpr int64_t kQ8Offset = 128;
using namespace fvec::zmm;
typedef __m512i vi;
inline vi iload(const void* p) { return _mm512_loadu_si512(p); }

// 4-bit codes come out as (b0 0-15, b1 0-15, b0 16-31, b1 16-31): x's codes are stored in that
// order (`code_index`), which saves a lane shuffle a weight row and step.
template <int64_t F>
constexpr bool kInterleaved = F != kQ8_0;

template <int64_t F>
inline vi codes(const uint8_t* b0, const uint8_t* b1) {
    if constexpr (F == kQ8_0) {
        const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 2));
        const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1 + 2));
        const vi q = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        return _mm512_xor_si512(q, _mm512_set1_epi8(char(0x80)));  // + 128, unsigned
    } else {
        const int64_t off = F == kQ4_1 ? 4 : 2;  // the codes' offset in a block
        const __m256i t = _mm256_inserti128_si256(_mm256_castsi128_si256(load16(b0 + off)),
                                                  load16(b1 + off), 1);
        const vi q = _mm512_inserti64x4(_mm512_castsi256_si512(t), _mm256_srli_epi16(t, 4), 1);
        return _mm512_and_si512(q, _mm512_set1_epi8(0x0F));
    }
}

// The step's scales d (and Q4_1's mins m) in each block's lanes: one vcvtph2ps, one vpermps.
template <int64_t F>
inline void step_scales(const uint8_t* b0, const uint8_t* b1, Vec& d, Vec& m) {
    const Vec h = _mm512_castps128_ps512(_mm_cvtph_ps(
        _mm_insert_epi32(_mm_cvtsi32_si128(load32(b0)), load32(b1), 1)));  // d0 m0 d1 m1 (Q4_1)
    // (Q4_0 and Q8_0 read their first two codes in m's place, and use only d.)
    const vi di = kInterleaved<F>
                      ? _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2)
                      : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
    d = _mm512_permutexvar_ps(di, h);
    if constexpr (F == kQ4_1)
        m = _mm512_permutexvar_ps(_mm512_add_epi32(di, _mm512_set1_epi32(1)), h);
}

// sum(q * a) per lane, from `init` (x's share of the block's offset, see `quantize_rows`).
template <int64_t F>
inline vi dot(vi w, vi a, vi init) {
    return _mm512_dpbusd_epi32(init, w, a);
}
#else
constexpr int64_t kStep = 1;
constexpr int64_t kQRows = 2, kQOut = 2;  // 4 accumulators + 6 weight vectors of 16 ymm
constexpr int64_t kQ8Offset = 0;  // signed codes: maddubs takes |q| and q's sign moves onto x
using namespace fvec::ymm;
typedef __m256i vi;
inline vi iload(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

template <int64_t F>
constexpr bool kInterleaved = false;

template <int64_t F>
inline vi codes(const uint8_t* b0, const uint8_t*) {
    if constexpr (F == kQ8_0) return iload(b0 + 2);
    const __m128i q = load16(b0 + (F == kQ4_1 ? 4 : 2)), low4 = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), low4), _mm_and_si128(q, low4));
}

template <int64_t F>
inline void step_scales(const uint8_t* b0, const uint8_t*, Vec& d, Vec& m) {
    d = _mm256_set1_ps(half(b0));
    if constexpr (F == kQ4_1) m = _mm256_set1_ps(half(b0 + 2));
}

template <int64_t F>
inline vi dot(vi w, vi a, vi init) {
    __m256i pairs;  // 16 int16 sums of 2 products, at most 2 * 128 * 127: no saturation
    if constexpr (F == kQ8_0)
        pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
    else
        pairs = _mm256_maddubs_epi16(w, a);
    return _mm256_add_epi32(init, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
#endif

// What q's codes are offset by (`codes`): w = d * (q - offset), or Q4_1's d * q + m.
template <int64_t F>
constexpr int64_t kOffset = F == kQ4_0 ? 8 : F == kQ8_0 ? kQ8Offset : 0;

}  // namespace q8
}  // namespace paternoster
