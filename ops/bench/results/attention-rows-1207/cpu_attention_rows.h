// Decode attention's inner loops over one cache block, for AVX-512 builds and head sizes that are
// a multiple of 32: included by cpu_paged_attention.cpp, whose `attend_one` takes them in place
// of cpu_attention_vec.h's loops there (the K pass for float32 and bf16 caches, the V pass for
// bf16 ones).
//
// Why: those loops read a bf16 cache at 12-13 GB/s a thread on an AMX Xeon, where the same
// kernel read float32 at 18-19 and `torch.sum` streams 53 GB/s on 2 threads: bound by
// instructions, not memory (BENCHMARKS.md, 2026-12-07). Per token and KV head they summed each
// query head's dot product across lanes alone (about 8 operations a sum, most of them
// shuffles, then a scalar multiply and store), and widened each 16 bf16 values with a shuffle
// (`vpmovzxwd`) and a shift; on Intel every 512-bit shuffle goes to one port, which the FMAs
// share. Here:
// - The K pass multiplies 8 tokens (4 where 4 query heads share the KV head) at once and sums
//   them across lanes 4 at a time (`sums4`): 6-7 operations a sum, one vector multiply by the
//   scale and one store for 4. The grouping of each sum is `_mm512_reduce_add_ps`'s, so a
//   float32 cache's scores keep their bits.
// - 32 bf16 values (16 dwords) become float32 by a shift (each dword's low half: the even
//   elements) and a mask (its high half: the odd ones), no shuffle. q is split the same way once
//   per call (`split_pairs`), the V pass accumulates its output split too, and `merge_pairs`
//   puts it back in order at the end. A bf16 cache's sums so run over other lanes than
//   before: its outputs differ from the earlier loops' within float32 rounding.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace paternoster {
namespace attention_rows {

#if defined(__AVX512F__)
#define PATERNOSTER_ATTENTION_ROWS 1

constexpr int64_t kPair = 32;  // K values a pass loads: 2 vectors (bf16: 1 load, 16 even, 16 odd)

// 32 bf16 values at p as float32: elements 0, 2, .., 30 (each dword's low half) and 1, 3, .., 31.
inline void load_pairs(const uint16_t* p, __m512& even, __m512& odd) {
    const __m512i d = _mm512_loadu_si512(p);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(d, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(d, _mm512_set1_epi32(int32_t(0xFFFF0000u))));
}

// n floats (a multiple of 32) into the order `load_pairs` gives: per 32, even elements then odd.
inline void split_pairs(const float* x, int64_t n, float* out) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28,
                                           30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (int64_t c = 0; c < n; c += kPair) {
        const __m512 a = _mm512_loadu_ps(x + c), b = _mm512_loadu_ps(x + c + 16);
        _mm512_storeu_ps(out + c, _mm512_permutex2var_ps(a, even, b));
        _mm512_storeu_ps(out + c + 16, _mm512_permutex2var_ps(a, odd, b));
    }
}

// The inverse of `split_pairs`.
inline void merge_pairs(const float* x, int64_t n, float* out) {
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    for (int64_t c = 0; c < n; c += kPair) {
        const __m512 e = _mm512_loadu_ps(x + c), o = _mm512_loadu_ps(x + c + 16);
        _mm512_storeu_ps(out + c, _mm512_permutex2var_ps(e, lo, o));
        _mm512_storeu_ps(out + c + 16, _mm512_permutex2var_ps(e, hi, o));
    }
}

// A zmm's lanes folded to 4 partial sums: lane j + lane j + 8, then + its neighbour 4 apart,
// the grouping `_mm512_reduce_add_ps` uses.
inline __m128 fold(__m512 v) {
    const __m256 h = _mm256_add_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)),
                                   _mm512_castps512_ps256(v));
    return _mm_add_ps(_mm256_extractf128_ps(h, 1), _mm256_castps256_ps128(h));
}

// The sums of 4 vectors' lanes, in order, each as `_mm512_reduce_add_ps` sums one (w0 + w2) +
// (w1 + w3) of its folded w: the same bits, so a float32 cache's scores do not change.
inline __m128 sums4(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
    const __m128 a = fold(v0), b = fold(v1), c = fold(v2), d = fold(v3);
    const __m128 ab = _mm_add_ps(_mm_unpacklo_ps(a, b), _mm_unpackhi_ps(a, b));
    const __m128 cd = _mm_add_ps(_mm_unpacklo_ps(c, d), _mm_unpackhi_ps(c, d));
    const __m128d abd = _mm_castps_pd(ab), cdd = _mm_castps_pd(cd);
    return _mm_add_ps(_mm_castpd_ps(_mm_unpacklo_pd(abd, cdd)),
                      _mm_castpd_ps(_mm_unpackhi_pd(abd, cdd)));
}

// K's 32 values from p as two vectors in the order q is kept: a bf16 cache's even and odd
// elements (`load_pairs`, q split by `split_pairs`), a float32 cache's first and last 16 (q as
// it is).
inline void load_k(const uint16_t* p, __m512& a, __m512& b) { load_pairs(p, a, b); }
inline void load_k(const float* p, __m512& a, __m512& b) {
    a = _mm512_loadu_ps(p);
    b = _mm512_loadu_ps(p + 16);
}

// res[g * res_stride + s] = scale * (q_g . k_s) for R rows k_s from row s (hs apart), q as
// `load_k` pairs it (G heads, hs apart). A float32 row's sums are those of
// cpu_attention_vec.h's block_dots, bit for bit: the same FMAs in the same order, the same
// grouping across lanes.
template <int G, int R, typename T>
inline void dots_rows(const float* q, const T* k, int64_t hs, float scale, float* res,
                      int64_t res_stride) {
    static_assert(R == 1 || R % 4 == 0, "rows are summed 4 at a time");
    __m512 acc[G][R];
    for (int g = 0; g < G; ++g)
        for (int r = 0; r < R; ++r) acc[g][r] = _mm512_setzero_ps();
    for (int64_t c = 0; c < hs; c += kPair) {
        // Unrolled, so that the G x R sums stay in registers: left to itself gcc kept them in
        // memory, a load and a store around every row's FMAs.
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            __m512 x0, x1;
            load_k(k + r * hs + c, x0, x1);
#pragma GCC unroll 4
            for (int g = 0; g < G; ++g) {
                acc[g][r] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * hs + c), x0, acc[g][r]);
                acc[g][r] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * hs + c + 16), x1, acc[g][r]);
            }
        }
    }
    for (int g = 0; g < G; ++g) {
        if constexpr (R == 1) {
            res[g * res_stride] = _mm512_reduce_add_ps(acc[g][0]) * scale;
        } else {
            for (int r = 0; r < R; r += 4) {
                const __m128 sums = sums4(acc[g][r], acc[g][r + 1], acc[g][r + 2], acc[g][r + 3]);
                _mm_storeu_ps(res + g * res_stride + r, _mm_mul_ps(sums, _mm_set1_ps(scale)));
            }
        }
    }
}

// block_dots (cpu_attention_vec.h) over a block of n rows, their sums reduced 4 at a time: 8
// rows at a time for up to 3 heads (24 accumulators), 4 for 4 heads, the last rows one by one.
template <int G, typename T>
inline void block_dots(const float* q, const T* k, int64_t n, int64_t hs, float scale,
                       float* res, int64_t res_stride) {
    constexpr int R = G <= 3 ? 8 : 4;
    int64_t s = 0;
    for (; s + R <= n; s += R) dots_rows<G, R>(q, k + s * hs, hs, scale, res + s, res_stride);
    for (; s < n; ++s) dots_rows<G, 1>(q, k + s * hs, hs, scale, res + s, res_stride);
}

// out_g += sum over s of p[g * p_stride + s] * v_s for a bf16 block of n rows, out split by
// `split_pairs` (G heads, hs apart).
template <int G>
inline void block_axpys(const float* p, int64_t p_stride, const uint16_t* v, int64_t n,
                        int64_t hs, float* out) {
    for (int64_t c = 0; c < hs; c += kPair) {
        __m512 a[G], b[G];
        for (int g = 0; g < G; ++g) {
            a[g] = _mm512_loadu_ps(out + g * hs + c);
            b[g] = _mm512_loadu_ps(out + g * hs + c + 16);
        }
        for (int64_t s = 0; s < n; ++s) {
            __m512 e, o;
            load_pairs(v + s * hs + c, e, o);
            for (int g = 0; g < G; ++g) {
                const __m512 w = _mm512_set1_ps(p[g * p_stride + s]);
                a[g] = _mm512_fmadd_ps(w, e, a[g]);
                b[g] = _mm512_fmadd_ps(w, o, b[g]);
            }
        }
        for (int g = 0; g < G; ++g) {
            _mm512_storeu_ps(out + g * hs + c, a[g]);
            _mm512_storeu_ps(out + g * hs + c + 16, b[g]);
        }
    }
}

#endif  // __AVX512F__

}  // namespace attention_rows
}  // namespace paternoster
