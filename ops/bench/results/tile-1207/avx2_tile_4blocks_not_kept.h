// The k-major kernels' AVX2 parts (cpu_gguf_kmajor.cpp): half a group a pass, or a tile.
#pragma once

#include <algorithm>

#include "cpu_gguf_kmajor.h"

namespace paternoster {
namespace kmajor {
// Internal linkage, as in the one file that includes this: the passes and readers then inline
// into linear_groups (with external linkage the AVX2 passes took 27.9 ms at 8 rows, not 17.8:
// quant_linear.py, 210 Q4_1 projections, 1 thread, Zen 5, 2026-12-07).
namespace {

#if defined(__AVX2__) && !defined(__AVX512F__)
// AVX2: 8 accumulators, 4 d and m, 2 weights, x broadcast. The haswell build on a Zen 5 (210
// Q4_1 projections, 1 thread, CPU ms; 2026-12-07): 4 rows 26.2 at 12 rows, 70.3 at 32; 5 rows
// 28.5, 74.2; 6 (spilling) 33.0, 90.2. Each pass dequantizes the group again, so from 16 rows a
// block is dequantized once into a tile that passes of 6 rows x 16 columns read (12
// accumulators, 2 weights, x): 34.5 against 38.1 at 16 rows, 47.1 / 54.8 at 24, 90.8 / 112.7
// at 48, 127.2 / 143.1 at 63 (and 28.3 / 28.7 at 12). Passes of 32 columns (2 rows, 8
// accumulators, each weight loaded once a row) took 41.7 against 30.4 at 12 rows.
constexpr int64_t kMaxRows = 4;
constexpr int64_t kTileRows = 6;
constexpr int64_t kTileFromRows = 16;
#ifndef PATERNOSTER_AVX2_TILE_BLOCKS
#define PATERNOSTER_AVX2_TILE_BLOCKS 4
#endif
constexpr int64_t kTileBlocks = PATERNOSTER_AVX2_TILE_BLOCKS;

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

template <int64_t R, int H, int64_t F>
void half_pass(const float* x, int64_t ldx, const uint8_t* group, int64_t nb, float* out,
               int64_t ldo) {
    __m256 acc[R][2];
    for (int64_t r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = group + b * Layout<F>::kGroupBlock;
        prefetch_ahead<F>(p);
        const HalfBlock<H, F> block(p);
        const float* xb = x + b * kBlock;
        for (int64_t k = 0; k < kBlock; ++k) {
            __m256 w[2];
            block.weights(k, w);
            for (int64_t r = 0; r < R; ++r) {
                const __m256 xv = _mm256_broadcast_ss(xb + r * ldx + k);
                acc[r][0] = _mm256_fmadd_ps(xv, w[0], acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(xv, w[1], acc[r][1]);
            }
        }
    }
    for (int64_t r = 0; r < R; ++r) {
        _mm256_storeu_ps(out + r * ldo + 16 * H, acc[r][0]);
        _mm256_storeu_ps(out + r * ldo + 16 * H + 8, acc[r][1]);
    }
}

// Both halves of a group for R rows of x; the second reads the group's bytes from cache (48
// blocks, 30 KB of Q4_1 or 52 KB of Q8_0, at SmolLM2's widest k).
template <int64_t R, int64_t F>
void group_pass(const float* x, int64_t ldx, const uint8_t* group, int64_t nb, float* out,
                int64_t ldo) {
    half_pass<R, 0, F>(x, ldx, group, nb, out, ldo);
    half_pass<R, 1, F>(x, ldx, group, nb, out, ldo);
}

template <int64_t F>
void block_tile(const uint8_t* p, float (*tile)[kCols]) {
    const HalfBlock<0, F> low(p);
    const HalfBlock<1, F> high(p);
    for (int64_t i = 0; i < kBlock; ++i) {
        __m256 w[2];
        low.weights(i, w);
        _mm256_store_ps(tile[i], w[0]);
        _mm256_store_ps(tile[i] + 8, w[1]);
        high.weights(i, w);
        _mm256_store_ps(tile[i] + 16, w[0]);
        _mm256_store_ps(tile[i] + 24, w[1]);
    }
}

// R rows of x by kn k of the tile's 16 columns from 16 h: over out where `first`, else added
// to it. The same FMAs in the same order as group_pass, so the same bits.
template <int64_t R>
void tile_pass(const float (*tile)[kCols], int64_t kn, int64_t h, const float* x, int64_t ldx,
               float* out, int64_t ldo, bool first) {
    __m256 acc[R][2];
    for (int64_t r = 0; r < R; ++r)
        for (int j = 0; j < 2; ++j)
            acc[r][j] =
                first ? _mm256_setzero_ps() : _mm256_loadu_ps(out + r * ldo + 16 * h + 8 * j);
    for (int64_t k = 0; k < kn; ++k) {
        const __m256 w0 = _mm256_load_ps(tile[k] + 16 * h);
        const __m256 w1 = _mm256_load_ps(tile[k] + 16 * h + 8);
        for (int64_t r = 0; r < R; ++r) {
            const __m256 xv = _mm256_broadcast_ss(x + r * ldx + k);
            acc[r][0] = _mm256_fmadd_ps(xv, w0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(xv, w1, acc[r][1]);
        }
    }
    for (int64_t r = 0; r < R; ++r)
        for (int j = 0; j < 2; ++j) _mm256_storeu_ps(out + r * ldo + 16 * h + 8 * j, acc[r][j]);
}

// From kTileFromRows rows: kTileBlocks blocks dequantized once into a tile that every pass of
// kTileRows rows reads, where group_pass dequantizes them again each pass of 4.
template <int64_t F>
void group_tiled(const float* x, int64_t ldx, int64_t rows, const uint8_t* group, int64_t nb,
                 float* out, int64_t ldo) {
    alignas(32) float tile[kTileBlocks * kBlock][kCols];
    for (int64_t b0 = 0; b0 < nb; b0 += kTileBlocks) {
        const int64_t nt = std::min(kTileBlocks, nb - b0);
        for (int64_t t = 0; t < nt; ++t) {
            const uint8_t* p = group + (b0 + t) * Layout<F>::kGroupBlock;
            prefetch_ahead<F>(p);
            block_tile<F>(p, tile + t * kBlock);
        }
        for (int64_t h = 0; h < 2; ++h)
            in_passes<kTileRows>(rows, [&](int64_t r, auto m) {
                tile_pass<decltype(m)::value>(tile, nt * kBlock, h, x + r * ldx + b0 * kBlock,
                                              ldx, out + r * ldo, ldo, b0 == 0);
            });
    }
}
#endif

}  // namespace
}  // namespace kmajor
}  // namespace paternoster
