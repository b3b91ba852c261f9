// Prefill attention's two register-blocked products in AVX-512 vectors: included by
// cpu_prefill_attention.cpp.
//   scores  s = q K^T over a K panel (head_size rows of keys, transposed once per sequence and
//           head): per head_size element, 4 key vectors loaded, one query value broadcast a row;
//   output  o += p V over V rows read in place from their blocks: per key, 4 vectors of the
//           head loaded once for all the rows held.
// 6 rows x 4 vectors are held: 24 of AVX-512's 32 registers. AVX2 has 16: built there with 3
// rows (32-key chunks; -march=haswell on a Zen 5, 2 threads, 2026-12-06) it took 1.36-1.45x
// SDPA's time at contexts of 1,024-1,914 tokens (16.3 against 11.3 ms at 1,536 x 512) and
// 1.01x at 512 x 512, so AVX2 builds keep SDPA and this header is empty there.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cpu_float_vec.h"

namespace paternoster {
namespace prefill_vec {

#if defined(__AVX512F__)
#define PATERNOSTER_PREFILL_VEC 1
using namespace fvec::zmm;

constexpr int kRows = 6;               // rows a micro-kernel holds: 6 x 4 accumulators
constexpr int64_t kKeys = 4 * kLanes;  // keys per chunk: 64

// s[r * kKeys + j] = q_r . k_j for R rows and the kKeys keys of a K panel (kt: head_size rows
// of `stride` floats, keys contiguous).
template <int R>
inline void score_rows(const float* const* q, const float* kt, int64_t stride, int64_t hs,
                       float* s) {
    Vec acc[R][4];
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < 4; ++v) acc[r][v] = zero();
    for (int64_t d = 0; d < hs; ++d) {
        const float* row = kt + d * stride;
        const Vec k0 = load(row), k1 = load(row + kLanes), k2 = load(row + 2 * kLanes),
                  k3 = load(row + 3 * kLanes);
        for (int r = 0; r < R; ++r) {
            const Vec b = splat(q[r][d]);
            acc[r][0] = fma(b, k0, acc[r][0]);
            acc[r][1] = fma(b, k1, acc[r][1]);
            acc[r][2] = fma(b, k2, acc[r][2]);
            acc[r][3] = fma(b, k3, acc[r][3]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < 4; ++v) store(s + r * kKeys + v * kLanes, acc[r][v]);
}

// o[r * hs + c ...] += sum over j < n of p[r * kKeys + j] * v_j[c ...], NV vectors from
// column c, for R rows; bf16 V rows (T = uint16_t) widened as they are loaded.
template <int R, int NV, typename T>
inline void add_values(const float* p, const T* const* v, int64_t n, int64_t c, int64_t hs,
                       float* o) {
    Vec acc[R][NV];
    for (int r = 0; r < R; ++r)
        for (int i = 0; i < NV; ++i) acc[r][i] = load(o + r * hs + c + i * kLanes);
    for (int64_t j = 0; j < n; ++j) {
        Vec x[NV];
        for (int i = 0; i < NV; ++i) x[i] = load(v[j] + c + i * kLanes);
        for (int r = 0; r < R; ++r) {
            const Vec w = splat(p[r * kKeys + j]);
            for (int i = 0; i < NV; ++i) acc[r][i] = fma(w, x[i], acc[r][i]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int i = 0; i < NV; ++i) store(o + r * hs + c + i * kLanes, acc[r][i]);
}

// Runs f with R = rows (1..kRows) as a compile-time constant.
template <typename F>
inline void with_rows(int64_t rows, F&& f) {
    switch (rows) {
        case 6: f(std::integral_constant<int, 6>{}); break;
        case 5: f(std::integral_constant<int, 5>{}); break;
        case 4: f(std::integral_constant<int, 4>{}); break;
        case 3: f(std::integral_constant<int, 3>{}); break;
        case 2: f(std::integral_constant<int, 2>{}); break;
        default: f(std::integral_constant<int, 1>{}); break;
    }
}

template <int R, typename T>
inline void add_values_all(const float* p, const T* const* v, int64_t n, int64_t hs, float* o) {
    int64_t c = 0;
    for (; c + 4 * kLanes <= hs; c += 4 * kLanes) add_values<R, 4>(p, v, n, c, hs, o);
    for (; c < hs; c += kLanes) add_values<R, 1>(p, v, n, c, hs, o);
}

#endif  // __AVX512F__

}  // namespace prefill_vec
}  // namespace paternoster
