// The k-major kernels' AVX-512 parts (cpu_gguf_kmajor.cpp): all 32 columns of a group a pass.
#pragma once

#include <algorithm>

#include "cpu_gguf_kmajor.h"

namespace paternoster {
namespace kmajor {
// Internal linkage, as in the one file that includes this: the passes and readers then inline
// into linear_groups (with external linkage the AVX2 passes took 27.9 ms at 8 rows, not 17.8:
// quant_linear.py, 210 Q4_1 projections, 1 thread, Zen 5, 2026-12-07).
namespace {

#if defined(__AVX512F__)
constexpr int64_t kMaxRows = 12;  // rows of x a pass: 24 accumulators, 2 weights, x broadcast

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

// out[r * ldo + c] = x row r . column c of the group, for R rows of x.
template <int64_t R, int64_t F>
void group_pass(const float* x, int64_t ldx, const uint8_t* group, int64_t nb, float* out,
                int64_t ldo) {
    __m512 acc[R][2];
    for (int64_t r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = group + b * Layout<F>::kGroupBlock;
        prefetch_ahead<F>(p);
        const GroupBlock<F> block(p);
        const float* xb = x + b * kBlock;
        for (int64_t k = 0; k < kBlock; ++k) {
            __m512 w[2];
            block.weights(k, w);
            for (int64_t r = 0; r < R; ++r) {
                const __m512 xv = _mm512_set1_ps(xb[r * ldx + k]);
                acc[r][0] = _mm512_fmadd_ps(xv, w[0], acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(xv, w[1], acc[r][1]);
            }
        }
    }
    for (int64_t r = 0; r < R; ++r) {
        _mm512_storeu_ps(out + r * ldo, acc[r][0]);
        _mm512_storeu_ps(out + r * ldo + 16, acc[r][1]);
    }
}

// A group's block as fp32 [k][column], the file's dequantized bits.
template <int64_t F>
void block_tile(const uint8_t* p, float (*tile)[kCols]) {
    const GroupBlock<F> block(p);
    for (int64_t i = 0; i < kBlock; ++i) {
        __m512 w[2];
        block.weights(i, w);
        _mm512_store_ps(tile[i], w[0]);
        _mm512_store_ps(tile[i] + 16, w[1]);
    }
}

// From 32 rows a group's blocks are dequantized 4 at a time into a 16 KB tile that every pass
// reads (2 loads a k for 24 FMAs), where group_pass dequantizes them again each pass of 12. The
// bundled file's 210 Q4_1 projections, 2 threads, wall ms, Zen 4, 2026-12-07 (quant_linear.py
// --systems q4_1_kmajor fp32_onednn), passes / tile of 4 blocks / of 1, 2, 8: 29.4 / 30.8 at 24
// rows, 39.7 / 36.7 at 32, 77.5 / 69.2 at 64, 159.5 / 133.8 at 128 (1: 164.6, 2: 151.3, 8:
// 153.4), 618.8 / 548.3 at 512 (767.7, 634.4, 637.7); fp32 oneDNN on packed weights 264-292 at
// 256 rows, 545-561 at 512. A 4 KB tile (1 block) reloads the accumulators every 32 k and
// reads x 128 bytes a row a pass; 32 KB (8) is L1's size, so x evicts it.
constexpr int64_t kTileBlocks = 4;
constexpr int64_t kTileFromRows = 32;

// R rows of x by kn k of the tile, all 32 columns: over out where `first`, else added to it.
// The same FMAs in the same order as group_pass, so the same bits.
template <int64_t R>
void tile_pass(const float (*tile)[kCols], int64_t kn, const float* x, int64_t ldx, float* out,
               int64_t ldo, bool first) {
    __m512 acc[R][2];
    for (int64_t r = 0; r < R; ++r)
        for (int j = 0; j < 2; ++j)
            acc[r][j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(out + r * ldo + 16 * j);
    for (int64_t k = 0; k < kn; ++k) {
        const __m512 w0 = _mm512_load_ps(tile[k]);
        const __m512 w1 = _mm512_load_ps(tile[k] + 16);
        for (int64_t r = 0; r < R; ++r) {
            const __m512 xv = _mm512_set1_ps(x[r * ldx + k]);
            acc[r][0] = _mm512_fmadd_ps(xv, w0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(xv, w1, acc[r][1]);
        }
    }
    for (int64_t r = 0; r < R; ++r)
        for (int j = 0; j < 2; ++j) _mm512_storeu_ps(out + r * ldo + 16 * j, acc[r][j]);
}

// From kTileFromRows rows: kTileBlocks blocks of the group dequantized once into a tile that
// every pass of kMaxRows rows reads, where group_pass dequantizes them again each pass.
template <int64_t F>
void group_tiled(const float* x, int64_t ldx, int64_t rows, const uint8_t* group, int64_t nb,
                 float* out, int64_t ldo) {
    alignas(64) float tile[kTileBlocks * kBlock][kCols];
    for (int64_t b0 = 0; b0 < nb; b0 += kTileBlocks) {
        const int64_t nt = std::min(kTileBlocks, nb - b0);
        for (int64_t t = 0; t < nt; ++t) {
            const uint8_t* p = group + (b0 + t) * Layout<F>::kGroupBlock;
            prefetch_ahead<F>(p);
            block_tile<F>(p, tile + t * kBlock);
        }
        in_passes<kMaxRows>(rows, [&](int64_t r, auto m) {
            tile_pass<decltype(m)::value>(tile, nt * kBlock, x + r * ldx + b0 * kBlock, ldx,
                                          out + r * ldo, ldo, b0 == 0);
        });
    }
}
#endif

}  // namespace
}  // namespace kmajor
}  // namespace paternoster
