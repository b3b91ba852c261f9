// The k-major kernel as measured in runs.txt (3): kernels/cpu_gguf_kmajor.cpp of 2026-12-07 ~19:50
// with an AVX2 tile (TILE_R rows x 16 columns a pass from TILE_MIN rows), for bench.py.
// The exact GGUF linear (x in fp32) over blocks stored k-major at load (Q4_0, Q4_1 and Q8_0;
// the layout and its readers: cpu_gguf_kmajor.h): output columns in vector lanes, x broadcast.
// A k's line of codes becomes the group's weights in a few operations (for Q4_1 a widen, a mask,
// a shift, two conversions and two FMAs for 32 columns), then each row of x takes one FMA a
// vector of columns a k: no horizontal sums, no transposes. The file's layout cannot be read so:
// a block there is one row's 32 k.
//
// Over the bundled file's 210 Q4_1 projections (1 thread, AMX Xeon, ms; micro-benchmark
// ops/bench/results/amx-split-1207/micro_kmajor.py --model, BENCHMARKS.md): 1 row 11.8 -> 10.0,
// 8 rows 20.4 -> 16.1, 12 rows 35.6 -> 21.4, 24 rows 57.2 -> 39.2 against the register kernels
// and the tile on the file's layout. The software prefetch is most of it below 10 rows: without
// it 1-8 rows were 0.90-1.11x the file layout's kernels (one sequential stream a thread).
// AVX2 builds read the layout half a group a pass (`HalfBlock`).

#include "kmajor_exp.h"  // kernels/cpu_gguf_kmajor.h as it was then

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <cstring>
#include <type_traits>

namespace paternoster {

using namespace quant;
using kmajor::kCols;
using kmajor::Layout;

namespace {

// 4 group-blocks ahead of the one being read (2.5 KB for Q4_1). Over the 210 Q4_1 projections,
// 1 thread: 2, 4 and 8 ahead were within 5% of each other at 1-24 rows (2026-12-07).
constexpr int64_t kPrefetchBlocks = 4;
#if defined(__AVX512F__)
constexpr int64_t kMaxRows = 12;  // rows of x a pass: 24 accumulators, 2 weights, x broadcast
#else
// AVX2: 8 accumulators, 4 d and m, 2 weights, x broadcast. The haswell build on a Zen 5 (210
// projections, 1 thread, CPU ms; 2026-12-07): 4 rows 26.2 at 12 rows, 70.3 at 32; 5 rows 28.5,
// 74.2; 6 (spilling) 33.0, 90.2. Dequantizing each block once into a 4 KB fp32 tile that every
// row then reads (the file layout's AVX2 way from 16 rows) took 41.7 at 12 rows against 30.4 in
// the same run: these passes dequantize under the FMAs, the tile before them.
constexpr int64_t kMaxRows = 4;
#endif

int64_t checked_groups(const at::Tensor& blocks, int64_t format) {
    checked_blocks(blocks, format);
    TORCH_CHECK(blocks.size(0) % kCols == 0, "blocks stored k-major are whole groups of ", kCols,
                " rows; ", blocks.size(0), " rows");
    return blocks.size(0) / kCols;
}

template <int64_t F>
inline void prefetch_ahead(const uint8_t* p) {
    constexpr int64_t bytes = Layout<F>::kGroupBlock;
    for (int64_t line = 0; line < bytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBlocks * bytes + line,
                     _MM_HINT_T0);
}

#if defined(__AVX512F__)
// out[r * ldo + c] = x row r . column c of the group, for R rows of x.
template <int64_t R, int64_t F>
void group_pass(const float* x, int64_t ldx, const uint8_t* group, int64_t nb, float* out,
                int64_t ldo) {
    __m512 acc[R][2];
    for (int64_t r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = group + b * Layout<F>::kGroupBlock;
        prefetch_ahead<F>(p);
        const kmajor::GroupBlock<F> block(p);
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
    const kmajor::GroupBlock<F> block(p);
    for (int64_t i = 0; i < kBlock; ++i) {
        __m512 w[2];
        block.weights(i, w);
        _mm512_store_ps(tile[i], w[0]);
        _mm512_store_ps(tile[i] + 16, w[1]);
    }
}
#elif defined(__AVX2__)
template <int64_t R, int H, int64_t F>
void half_pass(const float* x, int64_t ldx, const uint8_t* group, int64_t nb, float* out,
               int64_t ldo) {
    __m256 acc[R][2];
    for (int64_t r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = group + b * Layout<F>::kGroupBlock;
        prefetch_ahead<F>(p);
        const kmajor::HalfBlock<H, F> block(p);
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
    const kmajor::HalfBlock<0, F> low(p);
    const kmajor::HalfBlock<1, F> high(p);
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
#endif

#if !defined(__AVX512F__) && defined(__AVX2__)
// R rows x 16 columns of the tile (columns 16 H on), out accumulating.
template <int64_t R>
void tile_pass16(const float (*tile)[kCols], int64_t h, const float* x, int64_t ldx, float* out,
                 int64_t ldo) {
    __m256 acc[R][2];
    for (int64_t r = 0; r < R; ++r)
        for (int j = 0; j < 2; ++j) acc[r][j] = _mm256_loadu_ps(out + r * ldo + 16 * h + 8 * j);
    for (int64_t k = 0; k < kBlock; ++k) {
        const __m256 w0 = _mm256_load_ps(tile[k] + 16 * h), w1 = _mm256_load_ps(tile[k] + 16 * h + 8);
        for (int64_t r = 0; r < R; ++r) {
            const __m256 xv = _mm256_broadcast_ss(x + r * ldx + k);
            acc[r][0] = _mm256_fmadd_ps(xv, w0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(xv, w1, acc[r][1]);
        }
    }
    for (int64_t r = 0; r < R; ++r)
        for (int j = 0; j < 2; ++j) _mm256_storeu_ps(out + r * ldo + 16 * h + 8 * j, acc[r][j]);
}

template <int64_t F>
void group_tiled(const float* x, int64_t ldx, int64_t rows, const uint8_t* group, int64_t nb,
                 float* out, int64_t ldo) {
    alignas(32) float tile[kBlock][kCols];
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < kCols; ++c) out[r * ldo + c] = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = group + b * Layout<F>::kGroupBlock;
        prefetch_ahead<F>(p);
        block_tile<F>(p, tile);
        for (int64_t h = 0; h < 2; ++h)
            in_passes<TILE_R>(rows, [&](int64_t r, auto m) {
                tile_pass16<decltype(m)::value>(tile, h, x + r * ldx + b * kBlock, ldx, out + r * ldo, ldo);
            });
    }
}
#endif

#if defined(__AVX512F__) || defined(__AVX2__)
template <int64_t F>
void linear_groups(const float* xp, int64_t ldx, int64_t rows, const uint8_t* wp, int64_t n,
                   int64_t nb, float* op) {
    // Threads split the groups, so each streams its columns once; grain 2 keeps the smallest
    // projection here (192 columns of k/v) on 2+ threads.
    at::parallel_for(0, n / kCols, 2, [&](int64_t begin, int64_t end) {
        for (int64_t g = begin; g < end; ++g) {
            const uint8_t* group = wp + g * nb * Layout<F>::kGroupBlock;
#if !defined(__AVX512F__)
            if (rows >= TILE_MIN) { group_tiled<F>(xp, ldx, rows, group, nb, op + g * kCols, n); continue; }
#endif
            in_passes<kMaxRows>(rows, [&](int64_t r, auto m) {
                group_pass<decltype(m)::value, F>(xp + r * ldx, ldx, group, nb,
                                                  op + r * n + g * kCols, n);
            });
        }
    });
}

template <int64_t F>
void dequantize_groups(const uint8_t* wp, int64_t groups, int64_t nb, float* op) {
    const int64_t k = nb * kBlock;
    at::parallel_for(0, groups * nb, 16, [&](int64_t begin, int64_t end) {
        alignas(64) float tile[kBlock][kCols];  // [k][column] of one group's block
        for (int64_t t = begin; t < end; ++t) {
            const int64_t g = t / nb, b = t % nb;
            block_tile<F>(wp + t * Layout<F>::kGroupBlock, tile);
            for (int64_t c = 0; c < kCols; ++c) {
                float* dst = op + (g * kCols + c) * k + b * kBlock;
                for (int64_t i = 0; i < kBlock; ++i) dst[i] = tile[i][c];
            }
        }
    });
}
#endif

}  // namespace

bool gguf_kmajor_supported(int64_t format) {
#if defined(__AVX512F__) || defined(__AVX2__)
    return format == kQ4_0 || format == kQ4_1 || format == kQ8_0;
#else
    (void)format;
    return false;
#endif
}

at::Tensor gguf_linear_kmajor(const at::Tensor& x, const at::Tensor& blocks, int64_t format,
                              const c10::optional<at::Tensor>& bias) {
    checked_groups(blocks, format);
    TORCH_CHECK(gguf_kmajor_supported(format), "this build has no k-major kernel");
    return gguf_call(x, blocks, format, bias,
                     [](int64_t f, const float* xp, int64_t ldx, int64_t rows, const uint8_t* wp,
                        int64_t n, int64_t nb, float* op) {
#if defined(__AVX512F__) || defined(__AVX2__)
                         with_format(f, [&](auto fmt) {
                             linear_groups<decltype(fmt)::value>(xp, ldx, rows, wp, n, nb, op);
                         });
#else
                         (void)f, (void)xp, (void)ldx, (void)rows, (void)wp, (void)n, (void)nb,
                             (void)op;
#endif
                     });
}

at::Tensor gguf_dequantize_kmajor(const at::Tensor& blocks, int64_t format) {
    const int64_t groups = checked_groups(blocks, format);
    TORCH_CHECK(gguf_kmajor_supported(format), "this build has no k-major kernel");
    const int64_t nb = blocks.size(1) / block_bytes(format);
    at::Tensor out = at::empty({blocks.size(0), nb * kBlock}, blocks.options().dtype(at::kFloat));
#if defined(__AVX512F__) || defined(__AVX2__)
    with_format(format, [&](auto fmt) {
        dequantize_groups<decltype(fmt)::value>(blocks.data_ptr<uint8_t>(), groups, nb,
                                                out.data_ptr<float>());
    });
#endif
    return out;
}

at::Tensor gguf_kmajor_rows(const at::Tensor& blocks, int64_t format, const at::Tensor& index) {
    checked_groups(blocks, format);
    check(index, "index", at::kLong, 1);
    const int64_t nb = blocks.size(1) / block_bytes(format), bb = block_bytes(format);
    const int64_t rows = index.size(0), n = blocks.size(0);
    at::Tensor out = at::empty({rows, blocks.size(1)}, blocks.options());
    const at::Tensor ids = index.contiguous();
    const int64_t* id = ids.data_ptr<int64_t>();
    for (int64_t i = 0; i < rows; ++i)
        TORCH_CHECK(id[i] >= 0 && id[i] < n, "row ", id[i], " of ", n);
    const uint8_t* wp = blocks.data_ptr<uint8_t>();
    uint8_t* op = out.data_ptr<uint8_t>();
    with_format(format, [&](auto fmt) {
        using L = Layout<decltype(fmt)::value>;
        const int64_t line = L::kLine, heads = 2 * L::kHeads * kCols;
        at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) {
                const int64_t g = id[i] / kCols, c = id[i] % kCols;
                for (int64_t b = 0; b < nb; ++b) {
                    const uint8_t* p = wp + (g * nb + b) * L::kGroupBlock;
                    uint8_t* dst = op + i * nb * bb + b * bb;
                    for (int64_t h = 0; h < L::kHeads; ++h) std::memcpy(dst + 2 * h, p + 2 * (h * kCols + c), 2);
                    const uint8_t* lines = p + heads;
                    dst += 2 * L::kHeads;
                    if (line == kBlock) {  // Q8_0: line k, byte c
                        for (int64_t k = 0; k < kBlock; ++k) dst[k] = lines[k * line + c];
                    } else {  // the file's byte j: element j low, j + 16 high
                        const int shift = c < kCols / 2 ? 0 : 4;
                        const uint8_t* at = lines + c % (kCols / 2);
                        for (int64_t j = 0; j < kBlock / 2; ++j)
                            dst[j] = ((at[j * line] >> shift) & 15) |
                                     (((at[(j + kBlock / 2) * line] >> shift) & 15) << 4);
                    }
                }
            }
        });
    });
    return out;
}

}  // namespace paternoster
