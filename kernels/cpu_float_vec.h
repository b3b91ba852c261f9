// Float vectors for the kernels that spell their loops in intrinsics: decode attention
// (cpu_attention_vec.h) and the 8-bit-activation GGUF kernel (cpu_q8_vec.h). One namespace a
// width, not one choice for the build, because the two choose differently on one CPU: attention
// takes zmm wherever AVX-512F is, the q8 kernel only with BW and VNNI as well (its integer half
// needs them), so an AVX-512F CPU without VNNI runs q8 on ymm. Each user brings the width it
// chose in with a using-directive; the functions read the same either way.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace paternoster {
namespace fvec {

#if defined(__AVX512F__)
namespace zmm {
constexpr int64_t kLanes = 16;
using Vec = __m512;
inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
// bf16 is float32's upper half: widen 16 values by zero-extending to 32 bits and shifting.
inline Vec load(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline Vec splat(float x) { return _mm512_set1_ps(x); }
inline Vec cvt(__m512i v) { return _mm512_cvtepi32_ps(v); }
inline Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline float sum(Vec v) { return _mm512_reduce_add_ps(v); }
}  // namespace zmm
#endif

#if defined(__AVX2__) && defined(__FMA__)
namespace ymm {
constexpr int64_t kLanes = 8;
using Vec = __m256;
inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline Vec load(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline Vec splat(float x) { return _mm256_set1_ps(x); }
inline Vec cvt(__m256i v) { return _mm256_cvtepi32_ps(v); }
inline Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline float sum(Vec v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
}  // namespace ymm
#endif

}  // namespace fvec
}  // namespace paternoster
