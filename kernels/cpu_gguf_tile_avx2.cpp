// The exact GGUF linear on AVX2 from `kTileMinRows` rows of x (cpu_quant_linear.cpp takes
// fewer, and every row count on AVX-512): kTileOut weight rows at a time are dequantized into an
// fp32 tile (L1: 18 KB at k = 1536) and every row of x, kTileRows at a time, is multiplied into
// it with one ymm accumulator per (row, weight row) pair. The register path holds 2 x 2 there
// (16 floats are two ymm each), so it dequantized each block again per 2 rows of x; the engine
// instead dequantized the whole weight per call and ran F.linear on it from 3 rows, which wrote
// and read 4 bytes a weight (BENCHMARKS.md, "AVX2 only": the default at 0.55x fp32). Measured
// against both: worker/models/quant.py `GEMM_MIN_ROWS`.

#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "cpu_gguf_dequant.h"

namespace paternoster {
namespace quant {

#if !defined(__AVX512F__)
namespace {

constexpr int64_t kTileOut = 3;   // 4 x 3 accumulators + 3 weight + 1 x: the 16 ymm
constexpr int64_t kTileRows = 4;

// out[r * ldo + o] = dot(x row r, tile row o) over k (a multiple of 8: whole GGUF blocks).
template <int64_t R, int64_t O>
void tile_dot(const float* x, int64_t ldx, const float* tile, int64_t k, float* out,
              int64_t ldo) {
    __m256 acc[R][O];
    for (int64_t r = 0; r < R; ++r)
        for (int64_t o = 0; o < O; ++o) acc[r][o] = _mm256_setzero_ps();
    for (int64_t i = 0; i < k; i += 8) {
        __m256 wv[O];
        for (int64_t o = 0; o < O; ++o) wv[o] = _mm256_loadu_ps(tile + o * k + i);
        for (int64_t r = 0; r < R; ++r) {
            const __m256 xv = _mm256_loadu_ps(x + r * ldx + i);
            for (int64_t o = 0; o < O; ++o) acc[r][o] = _mm256_fmadd_ps(xv, wv[o], acc[r][o]);
        }
    }
    for (int64_t r = 0; r < R; ++r) {
        for (int64_t o = 0; o < O; ++o) {  // hsum's fixed order, on the 8 lanes
            const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc[r][o]),
                                         _mm256_extractf128_ps(acc[r][o], 1));
            const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            out[r * ldo + o] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
        }
    }
}

// tile_dot with R = rows, 1 <= rows <= kTileRows (the last rows of x).
template <int64_t O, int64_t R = kTileRows>
void tile_few(int64_t rows, const float* x, int64_t ldx, const float* tile, int64_t k,
              float* out, int64_t ldo) {
    if (rows == R)
        tile_dot<R, O>(x, ldx, tile, k, out, ldo);
    else if constexpr (R > 1)
        tile_few<O, R - 1>(rows, x, ldx, tile, k, out, ldo);
}

// O (<= kTileOut) weight rows through the tile, against every row of x.
template <int64_t F, int64_t O>
void tile_rows(const float* x, int64_t ldx, int64_t rows, const uint8_t* w, int64_t ldw,
               int64_t nb, float* tile, float* out, int64_t ldo) {
    const int64_t k = nb * kBlock;
    for (int64_t o = 0; o < O; ++o) dequant_row<F>(w + o * ldw, nb, tile + o * k);
    for (int64_t r = 0; r < rows; r += kTileRows) {
        const int64_t m = std::min(kTileRows, rows - r);
        tile_few<O>(m, x + r * ldx, ldx, tile, k, out + r * ldo, ldo);
    }
}

template <int64_t F>
void tiled(const float* x, int64_t ldx, int64_t rows, const uint8_t* w, int64_t n, int64_t nb,
           float* out) {
    const int64_t ldw = nb * block_bytes(F);
    at::parallel_for(0, (n + kTileOut - 1) / kTileOut, 16, [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> tile;
        tile.resize(kTileOut * nb * kBlock);
        for (int64_t p = begin; p < end; ++p) {
            const int64_t o0 = p * kTileOut, left = n - o0;
            const uint8_t* wp = w + o0 * ldw;
            if (left >= kTileOut)
                tile_rows<F, kTileOut>(x, ldx, rows, wp, ldw, nb, tile.data(), out + o0, n);
            else if (left == 2)
                tile_rows<F, 2>(x, ldx, rows, wp, ldw, nb, tile.data(), out + o0, n);
            else
                tile_rows<F, 1>(x, ldx, rows, wp, ldw, nb, tile.data(), out + o0, n);
        }
    });
}

}  // namespace

void gguf_tiled(const float* x, int64_t ldx, int64_t rows, const uint8_t* w, int64_t n,
                int64_t nb, int64_t format, float* out) {
    with_format(format, [&](auto F) { tiled<decltype(F)::value>(x, ldx, rows, w, n, nb, out); });
}
#endif

}  // namespace quant
}  // namespace paternoster
