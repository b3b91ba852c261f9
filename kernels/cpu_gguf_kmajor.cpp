// The exact GGUF linear (x in fp32) over Q4_1 blocks stored k-major at load
// (kernels/quant_reference.py `pack_kmajor`): output columns in vector lanes, x broadcast. Per 32
// weight rows (output columns) and block: their 32 d and 32 m (fp16), then for each of the
// block's 32 k one 16-byte line of codes, column c's in byte c % 16 (low nibble for c < 16, high
// for c >= 16). The file's 20 bytes a block a row. A k's line becomes two vectors of 16 weights
// by a widen, a mask, a shift, two conversions and fma(q, d, m) (the file's dequantized bits, as
// cpu_gguf_dequant.h computes them), then each row of x takes two FMAs a k: no horizontal sums,
// no transposes. The file's layout cannot be read so: a block there is one row's 32 k.
//
// Over the bundled file's 210 projections (1 thread, AMX Xeon, ms; micro-benchmark
// ops/bench/results/amx-split-1207/micro_kmajor.py --model, BENCHMARKS.md): 1 row 11.8 -> 10.0,
// 8 rows 20.4 -> 16.1, 12 rows 35.6 -> 21.4, 24 rows 57.2 -> 39.2 against the register kernels
// and the tile on the file's layout. The software prefetch is most of it below 10 rows: without
// it 1-8 rows were 0.90-1.11x the file layout's kernels (one sequential stream a thread).
// AVX-512 builds only: `gguf_kmajor_supported`.

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <type_traits>

#include "cpu_quant.h"

namespace paternoster {

using namespace quant;

namespace {

constexpr int64_t kCols = 32;  // output columns a group: two zmm
// Bytes of one group's block: 32 d, 32 m, 32 lines of 16 bytes (= 32 rows x 20 bytes).
constexpr int64_t kGroupBlock = 4 * kCols + kBlock * 16;
// 4 group-blocks (2.5 KB) ahead of the one being read. Over the 210 projections, 1 thread:
// 2, 4 and 8 ahead were within 5% of each other at 1-24 rows (2026-12-07).
constexpr int64_t kPrefetchBytes = 4 * kGroupBlock;
constexpr int64_t kMaxRows = 12;  // rows of x a pass: 24 accumulators, 2 weights, x broadcast

int64_t checked_groups(const at::Tensor& blocks, int64_t format) {
    checked_blocks(blocks, format);
    TORCH_CHECK(format == kQ4_1, "blocks stored k-major are Q4_1 (3) only, not ", format);
    TORCH_CHECK(blocks.size(0) % kCols == 0, "blocks stored k-major are whole groups of ", kCols,
                " rows; ", blocks.size(0), " rows");
    return blocks.size(0) / kCols;
}

#if defined(__AVX512F__)
struct GroupBlock {
    __m512 d[2], m[2];
    const uint8_t* lines;
    explicit GroupBlock(const uint8_t* p) : lines(p + 4 * kCols) {
        const auto* h = reinterpret_cast<const __m256i*>(p);
        for (int j = 0; j < 2; ++j) {
            d[j] = _mm512_cvtph_ps(_mm256_loadu_si256(h + j));
            m[j] = _mm512_cvtph_ps(_mm256_loadu_si256(h + 2 + j));
        }
    }
    // k's 32 weights: columns 0-15 in w[0], 16-31 in w[1].
    void weights(int64_t k, __m512 (&w)[2]) const {
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(
            reinterpret_cast<const __m128i*>(lines + k * 16)));
        const __m512i q0 = _mm512_and_si512(v, _mm512_set1_epi32(15));
        const __m512i q1 = _mm512_srli_epi32(v, 4);
        w[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q0), d[0], m[0]);
        w[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q1), d[1], m[1]);
    }
};

// out[r * ldo + c] = x row r . column c of the group, for R rows of x.
template <int64_t R>
void group_pass(const float* x, int64_t ldx, const uint8_t* group, int64_t nb, float* out,
                int64_t ldo) {
    __m512 acc[R][2];
    for (int64_t r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = group + b * kGroupBlock;
        for (int64_t line = 0; line < kGroupBlock; line += 64)
            _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes + line, _MM_HINT_T0);
        const GroupBlock block(p);
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
#endif

}  // namespace

bool gguf_kmajor_supported(int64_t format) {
#if defined(__AVX512F__)
    return format == kQ4_1;
#else
    (void)format;
    return false;
#endif
}

at::Tensor gguf_linear_kmajor(const at::Tensor& x, const at::Tensor& blocks, int64_t format,
                              const c10::optional<at::Tensor>& bias) {
    const int64_t groups = checked_groups(blocks, format);
    TORCH_CHECK(gguf_kmajor_supported(format), "this build has no k-major kernel");
    return gguf_call(x, blocks, format, bias,
                     [groups](int64_t, const float* xp, int64_t ldx, int64_t rows,
                              const uint8_t* wp, int64_t n, int64_t nb, float* op) {
#if defined(__AVX512F__)
                         // Threads split the groups, so each streams its columns once; grain 2
                         // keeps the smallest projection here (192 columns of k/v) on 2+ threads.
                         at::parallel_for(0, groups, 2, [&](int64_t begin, int64_t end) {
                             for (int64_t g = begin; g < end; ++g) {
                                 const uint8_t* group = wp + g * nb * kGroupBlock;
                                 in_passes<kMaxRows>(rows, [&](int64_t r, auto m) {
                                     group_pass<decltype(m)::value>(xp + r * ldx, ldx, group, nb,
                                                                    op + r * n + g * kCols, n);
                                 });
                             }
                         });
#else
                         (void)groups, (void)xp, (void)ldx, (void)rows, (void)wp, (void)n,
                             (void)nb, (void)op;
#endif
                     });
}

at::Tensor gguf_dequantize_kmajor(const at::Tensor& blocks, int64_t format) {
    const int64_t groups = checked_groups(blocks, format);
    TORCH_CHECK(gguf_kmajor_supported(format), "this build has no k-major kernel");
    const int64_t nb = blocks.size(1) / block_bytes(format), k = nb * kBlock;
    at::Tensor out = at::empty({blocks.size(0), k}, blocks.options().dtype(at::kFloat));
#if defined(__AVX512F__)
    const uint8_t* wp = blocks.data_ptr<uint8_t>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, groups * nb, 16, [&](int64_t begin, int64_t end) {
        alignas(64) float tile[kBlock][kCols];  // [k][column] of one group's block
        for (int64_t t = begin; t < end; ++t) {
            const int64_t g = t / nb, b = t % nb;
            const GroupBlock block(wp + t * kGroupBlock);
            for (int64_t i = 0; i < kBlock; ++i) {
                __m512 w[2];
                block.weights(i, w);
                _mm512_store_ps(tile[i], w[0]);
                _mm512_store_ps(tile[i] + 16, w[1]);
            }
            for (int64_t c = 0; c < kCols; ++c) {
                float* dst = op + (g * kCols + c) * k + b * kBlock;
                for (int64_t i = 0; i < kBlock; ++i) dst[i] = tile[i][c];
            }
        }
    });
#endif
    return out;
}

}  // namespace paternoster
