// The exact GGUF linear (x in fp32) over blocks stored k-major at load (Q4_0, Q4_1 and Q8_0;
// the layout: cpu_gguf_kmajor.h): output columns in vector lanes, x broadcast.
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
// AVX2 builds read the layout half a group a pass (`HalfBlock`), and from 16 rows of x dequantize
// each block once into a tile; AVX-512 builds, from 32 rows, 4 blocks at a time. Every row count
// gives a row the same bits: the tiles' passes run group_pass's FMAs in its order.

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <cstring>
#include <type_traits>

#if defined(__AVX512F__)
#include "cpu_gguf_kmajor_avx512.h"
#elif defined(__AVX2__)
#include "cpu_gguf_kmajor_avx2.h"
#else
#include "cpu_gguf_kmajor.h"
#endif

namespace paternoster {

using namespace quant;
using namespace kmajor;

namespace {

int64_t checked_groups(const at::Tensor& blocks, int64_t format) {
    checked_blocks(blocks, format);
    TORCH_CHECK(blocks.size(0) % kCols == 0, "blocks stored k-major are whole groups of ", kCols,
                " rows; ", blocks.size(0), " rows");
    return blocks.size(0) / kCols;
}

#if defined(__AVX512F__) || defined(__AVX2__)
template <int64_t F>
void linear_groups(const float* xp, int64_t ldx, int64_t rows, const uint8_t* wp, int64_t n,
                   int64_t nb, float* op) {
    // Threads split the groups, so each streams its columns once; grain 2 keeps the smallest
    // projection here (192 columns of k/v) on 2+ threads.
    at::parallel_for(0, n / kCols, 2, [&](int64_t begin, int64_t end) {
        for (int64_t g = begin; g < end; ++g) {
            const uint8_t* group = wp + g * nb * Layout<F>::kGroupBlock;
            if (rows >= kTileFromRows) {
                group_tiled<F>(xp, ldx, rows, group, nb, op + g * kCols, n);
                continue;
            }
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
                    for (int64_t h = 0; h < L::kHeads; ++h)
                        std::memcpy(dst + 2 * h, p + 2 * (h * kCols + c), 2);
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
