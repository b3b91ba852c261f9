// Decode attention's two inner loops over one cache block, in explicit vectors (AVX-512 or
// AVX2 with FMA): included by cpu_paged_attention.cpp, which keeps its `#pragma omp simd` loops
// for head sizes that are not a multiple of the vector and for CPUs with neither.
//
// Why: the pragma loops ran a token's K row as G dot products of head_size values, each summed
// across lanes at once, and a token's V row as G axpys that loaded and stored the output every
// token. With the rows in L2 (2 sequences x 200 tokens, SmolLM2's 3 query heads per KV head,
// 1 thread, AMX Xeon) that read K/V at 13.6 GB/s: the loop, not memory, was the bound, and a
// bf16 cache, widened in the same loops, ran slower than float32 (4.0 GB/s) although it moves
// half the bytes. Here two K rows are in flight at once (2G independent sums), and the V pass
// keeps each head's slice of the output in a register for a whole block (one load and store a
// block instead of a token), with each V vector loaded once for all G heads.
#pragma once

#include <cstdint>

#include "cpu_float_vec.h"

namespace paternoster {
namespace attention_vec {

#if defined(__AVX512F__)
using namespace fvec::zmm;
#define PATERNOSTER_ATTENTION_VEC 1
#elif defined(__AVX2__) && defined(__FMA__)
using namespace fvec::ymm;
#define PATERNOSTER_ATTENTION_VEC 1
#endif

#ifdef PATERNOSTER_ATTENTION_VEC

// res[g * res_stride + s] = scale * (q_g . k_s) for the n rows k_s (hs apart) and G query heads
// q_g (hs apart). hs is a multiple of kLanes.
template <int G, typename T>
inline void block_dots(const float* q, const T* k, int64_t n, int64_t hs, float scale, float* res,
                       int64_t res_stride) {
    int64_t s = 0;
    for (; s + 2 <= n; s += 2) {
        const T* k0 = k + s * hs;
        const T* k1 = k0 + hs;
        Vec a[G], b[G];
        for (int g = 0; g < G; ++g) a[g] = b[g] = zero();
        for (int64_t c = 0; c < hs; c += kLanes) {
            const Vec x0 = load(k0 + c), x1 = load(k1 + c);
            for (int g = 0; g < G; ++g) {
                const Vec qg = load(q + g * hs + c);
                a[g] = fma(qg, x0, a[g]);
                b[g] = fma(qg, x1, b[g]);
            }
        }
        for (int g = 0; g < G; ++g) {
            res[g * res_stride + s] = sum(a[g]) * scale;
            res[g * res_stride + s + 1] = sum(b[g]) * scale;
        }
    }
    if (s < n) {
        const T* k0 = k + s * hs;
        Vec a[G];
        for (int g = 0; g < G; ++g) a[g] = zero();
        for (int64_t c = 0; c < hs; c += kLanes) {
            const Vec x0 = load(k0 + c);
            for (int g = 0; g < G; ++g) a[g] = fma(load(q + g * hs + c), x0, a[g]);
        }
        for (int g = 0; g < G; ++g) res[g * res_stride + s] = sum(a[g]) * scale;
    }
}

// out_g += sum over s of p[g * p_stride + s] * v_s, for the n rows v_s (hs apart) and G heads
// (out_g hs apart). Two vectors of the head at a time: 2G independent sums.
template <int G, typename T>
inline void block_axpys(const float* p, int64_t p_stride, const T* v, int64_t n, int64_t hs,
                        float* out) {
    int64_t c = 0;
    for (; c + 2 * kLanes <= hs; c += 2 * kLanes) {
        Vec a[G], b[G];
        for (int g = 0; g < G; ++g) {
            a[g] = load(out + g * hs + c);
            b[g] = load(out + g * hs + c + kLanes);
        }
        for (int64_t s = 0; s < n; ++s) {
            const Vec x0 = load(v + s * hs + c), x1 = load(v + s * hs + c + kLanes);
            for (int g = 0; g < G; ++g) {
                const Vec w = splat(p[g * p_stride + s]);
                a[g] = fma(w, x0, a[g]);
                b[g] = fma(w, x1, b[g]);
            }
        }
        for (int g = 0; g < G; ++g) {
            store(out + g * hs + c, a[g]);
            store(out + g * hs + c + kLanes, b[g]);
        }
    }
    if (c < hs) {
        Vec a[G];
        for (int g = 0; g < G; ++g) a[g] = load(out + g * hs + c);
        for (int64_t s = 0; s < n; ++s) {
            const Vec x0 = load(v + s * hs + c);
            for (int g = 0; g < G; ++g) a[g] = fma(splat(p[g * p_stride + s]), x0, a[g]);
        }
        for (int g = 0; g < G; ++g) store(out + g * hs + c, a[g]);
    }
}

#endif  // PATERNOSTER_ATTENTION_VEC

}  // namespace attention_vec
}  // namespace paternoster
