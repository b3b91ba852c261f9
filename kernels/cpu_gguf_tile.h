// The exact GGUF linear (x in fp32) for many rows of x: Out weight rows at a time are
// dequantized into an fp32 tile (in L1: 24 KB for 4 rows at k = 1,536), and every row of x,
// Rows at a time, is multiplied into it, so each block is dequantized once per call. The
// register kernels dequantize a block once per pass of rows instead (8 rows on AVX-512, 4 on
// AVX2), which past a few passes costs more than the FMAs: on an AMX Xeon (1 thread, the
// bundled file's 210 Q4_1 projections) AVX-512's took 3.1 ms a row of x from 16 rows, where
// oneDNN's fp32 GEMM takes 1.5 (BENCHMARKS.md, "The exact GGUF tile on AVX-512").
// One template for both builds, over a native vector (`Ymm`, `Zmm`), from 10-16 rows (cpu_quant.h):
// the GGUF linear (cpu_gguf_avx2.cpp on AVX2, cpu_quant_linear.cpp on AVX-512) and `int8_linear`.
#pragma once

#include <ATen/Parallel.h>

#include <vector>

#include "cpu_gguf_dequant.h"

namespace paternoster {
namespace quant {

struct Ymm {
    using V = __m256;
    static constexpr int64_t kWidth = 8;
    static V zero() { return _mm256_setzero_ps(); }
    static V load(const float* p) { return _mm256_loadu_ps(p); }
    static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
    static __m256 ymm(V v) { return v; }
};

#if defined(__AVX512F__)
struct Zmm {
    using V = __m512;
    static constexpr int64_t kWidth = 16;
    static V zero() { return _mm512_setzero_ps(); }
    static V load(const float* p) { return _mm512_loadu_ps(p); }
    static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
    static __m256 ymm(V v) {  // the two halves added
        const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
        return _mm256_add_ps(_mm512_castps512_ps256(v), high);
    }
};
#endif

// The sums of four ymm, in one xmm: three hadds and one add. Each of a pass's R x O dot
// products ends in a sum, one per k / 16 FMAs (36 at k = 576); summed one at a time (extract,
// add, movehl, add, shuffle, add) the tile took 2-6% longer (AMX Xeon, both builds in one
// process, 210 Q4_1 projections: 64 rows 113.3 -> 106.7 ms, 1 thread; haswell build 32 rows
// 135.9 -> 132.2).
inline __m128 sum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// out[r * ldo + o] = scale[o] * dot(x row r, tile row o) over k (a multiple of the vector;
// scale null: 1, as cpu_quant.h's dot_block).
template <class Vec, int64_t R, int64_t O>
void tile_dot(const float* x, int64_t ldx, const float* tile, int64_t k, const float* scale,
              float* out, int64_t ldo) {
    static_assert(O <= 4, "one sum4 a row of x");
    using V = typename Vec::V;
    V acc[R][O];
    for (int64_t r = 0; r < R; ++r)
        for (int64_t o = 0; o < O; ++o) acc[r][o] = Vec::zero();
    for (int64_t i = 0; i < k; i += Vec::kWidth) {
        V wv[O];
        for (int64_t o = 0; o < O; ++o) wv[o] = Vec::load(tile + o * k + i);
        for (int64_t r = 0; r < R; ++r) {
            V xv = Vec::load(x + r * ldx + i);
            // In a register: gcc otherwise folds this load into each of the O FMAs (on AVX2,
            // 15 loads for 12 FMAs where 7 do).
            __asm__("" : "+v"(xv));
            for (int64_t o = 0; o < O; ++o) acc[r][o] = Vec::fma(xv, wv[o], acc[r][o]);
        }
    }
    for (int64_t r = 0; r < R; ++r) {
        __m256 y[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
        for (int64_t o = 0; o < O; ++o) y[o] = Vec::ymm(acc[r][o]);
        const __m128 sums = sum4(y[0], y[1], y[2], y[3]);
        if constexpr (O == 4) {
            _mm_storeu_ps(out + r * ldo, scale ? _mm_mul_ps(sums, _mm_loadu_ps(scale)) : sums);
        } else {
            float s[4];
            _mm_storeu_ps(s, sums);
            for (int64_t o = 0; o < O; ++o) out[r * ldo + o] = scale ? s[o] * scale[o] : s[o];
        }
    }
}

// O weight rows through the tile, against every row of x in passes of Rows; fill(o, dst)
// writes weight row o's k floats, scale (null: none) holds the O rows' scales.
template <class Vec, int64_t Rows, int64_t O, class Fill>
void tile_rows(const float* x, int64_t ldx, int64_t rows, int64_t k, int64_t o0, Fill& fill,
               const float* scale, float* tile, float* out, int64_t ldo) {
    for (int64_t o = 0; o < O; ++o) fill(o0 + o, tile + o * k);
    in_passes<Rows>(rows, [&](int64_t r, auto n) {
        tile_dot<Vec, decltype(n)::value, O>(x + r * ldx, ldx, tile, k, scale, out + r * ldo,
                                             ldo);
    });
}

// The last n % Out weight rows (fewer than a group), one group of their own size.
template <class Vec, int64_t Rows, int64_t O, class Fill>
void tile_tail(int64_t left, const float* x, int64_t ldx, int64_t rows, int64_t k, int64_t o0,
               Fill& fill, const float* scale, float* tile, float* out, int64_t ldo) {
    if (left == O)
        tile_rows<Vec, Rows, O>(x, ldx, rows, k, o0, fill, scale, tile, out, ldo);
    else if constexpr (O > 1)
        tile_tail<Vec, Rows, O - 1>(left, x, ldx, rows, k, o0, fill, scale, tile, out, ldo);
}

// out (rows, n) = x @ W.T, W's n rows of k floats (k a multiple of the vector) made by
// fill(o, dst), each output column times scale[o] where scale is not null. Threads split the
// weight rows (grain 16 groups, as the register kernels), each with a tile of its own.
template <class Vec, int64_t Out, int64_t Rows, class Fill>
void tiled(const float* x, int64_t ldx, int64_t rows, int64_t n, int64_t k, Fill fill,
           const float* scale, float* out) {
    at::parallel_for(0, (n + Out - 1) / Out, 16, [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> tile;
        tile.resize(Out * k);
        for (int64_t p = begin; p < end; ++p) {
            const int64_t o0 = p * Out;
            const float* s = scale ? scale + o0 : nullptr;
            if (o0 + Out <= n)
                tile_rows<Vec, Rows, Out>(x, ldx, rows, k, o0, fill, s, tile.data(), out + o0, n);
            else
                tile_tail<Vec, Rows, Out - 1>(n - o0, x, ldx, rows, k, o0, fill, s, tile.data(),
                                              out + o0, n);
        }
    });
}

// The build's tile: its vector, weight rows a tile (Out) and rows of x a pass (Rows).
// - AVX-512: 6 x 4 accumulators, 4 weight and 1 x of 32 zmm; 4 weight rows, 24 KB at k = 1,536,
//   fit a 32 KB L1. 6 weight rows x 4 rows of x timed the same within noise (AMX Xeon, 1 and 2
//   threads; BENCHMARKS.md).
// - AVX2: 4 x 3 accumulators, 3 weight and 1 x: the 16 ymm.
#if defined(__AVX512F__)
using TileVec = Zmm;
constexpr int64_t kTileOut = 4, kTileRows = 6;
#else
using TileVec = Ymm;
constexpr int64_t kTileOut = 3, kTileRows = 4;
#endif

// The GGUF linear: W as n rows of nb blocks of format F, each dequantized once per call.
template <int64_t F>
void gguf_tiled(const float* x, int64_t ldx, int64_t rows, const uint8_t* w, int64_t n,
                int64_t nb, float* out) {
    const int64_t ldw = nb * block_bytes(F);
    auto fill = [&](int64_t o, float* dst) { dequant_row<F>(w + o * ldw, nb, dst); };
    tiled<TileVec, kTileOut, kTileRows>(x, ldx, rows, n, nb * kBlock, fill, nullptr, out);
}

}  // namespace quant
}  // namespace paternoster
