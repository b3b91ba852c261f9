// The exact GGUF linear (x in fp32) on AVX2 builds, at every row count; AVX-512 builds run
// cpu_quant_linear.cpp's. Native ymm throughout: that file's 16-float vectors are two ymm each
// on AVX2, and gcc kept its accumulators on the stack and moved them through general registers
// every block, so its 1-row pass took 26.4 ms over the bundled file's 210 Q4_1 projections
// where these registers take 9.7 (fp32's skinny_linear 18-23; ops/bench/quant_linear.py, the
// haswell build on a Zen 4, 1 thread).
// - Fewer than kTileMinRows rows: each block of kRegOut weight rows is dequantized into
//   registers and multiplied into up to kRegRows rows of x while there.
// - From kTileMinRows rows: kTileOut weight rows at a time are dequantized into an fp32 tile (L1:
//   18 KB at k = 1,536) and every row of x, kTileRows at a time, is multiplied into it, each
//   block dequantized once per call. Before, the engine dequantized the whole weight for
//   F.linear from 3 rows, writing and reading 4 bytes a weight (BENCHMARKS.md, "AVX2 only": the
//   default at 0.55x fp32); that GEMM now takes over only where it wins (quant_paths.py
//   `GEMM_MIN_ROWS`).

#include <ATen/Parallel.h>

#include "cpu_gguf_tile.h"

namespace paternoster {
namespace quant {

#if !defined(__AVX512F__)
namespace {

// out[r * ldo + o] for R rows of x and O weight rows, each block dequantized into registers
// once for the R rows. Up to 4 pairs take two accumulators each (even and odd eighths of a
// block), so 1 row x 2 weight rows keeps 4 FMA chains going; more take one (R x O x A ymm).
template <int64_t F, int64_t R, int64_t O>
void reg_block(const float* x, int64_t ldx, const uint8_t* w, int64_t ldw, int64_t nb,
               float* out, int64_t ldo) {
    constexpr int64_t A = R * O <= 4 ? 2 : 1;
    __m256 acc[R][O][2];
    for (int64_t r = 0; r < R; ++r)
        for (int64_t o = 0; o < O; ++o) acc[r][o][0] = acc[r][o][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        for (int64_t o = 0; o < O; ++o) {
            const uint8_t* blk = w + o * ldw + b * block_bytes(F);
            __builtin_prefetch(blk + O * ldw);  // the next O rows (see cpu_quant_linear.cpp)
            __m256 wv[4];
            dequant_ymm<F>(blk, wv);
            for (int64_t r = 0; r < R; ++r) {
                const float* xr = x + r * ldx + b * kBlock;
                for (int64_t j = 0; j < 4; ++j)
                    acc[r][o][j % A] =
                        _mm256_fmadd_ps(_mm256_loadu_ps(xr + 8 * j), wv[j], acc[r][o][j % A]);
            }
        }
    }
    for (int64_t r = 0; r < R; ++r)
        for (int64_t o = 0; o < O; ++o)
            out[r * ldo + o] = hsum8(_mm256_add_ps(acc[r][o][0], acc[r][o][1]));
}

// Fewer than kTileMinRows rows: kRegOut weight rows against kRegRows rows of x a pass.
constexpr int64_t kRegOut = 2;
constexpr int64_t kRegRows = 4;

template <int64_t F, int64_t O>
void reg_rows(const float* x, int64_t ldx, int64_t rows, const uint8_t* w, int64_t ldw,
              int64_t nb, float* out, int64_t ldo) {
    in_passes<kRegRows>(rows, [&](int64_t r, auto n) {
        reg_block<F, decltype(n)::value, O>(x + r * ldx, ldx, w, ldw, nb, out + r * ldo, ldo);
    });
}

template <int64_t F>
void in_registers(const float* x, int64_t ldx, int64_t rows, const uint8_t* w, int64_t n,
                  int64_t nb, float* out) {
    const int64_t ldw = nb * block_bytes(F);
    at::parallel_for(0, (n + kRegOut - 1) / kRegOut, 16, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
            const int64_t o0 = p * kRegOut;
            if (o0 + kRegOut <= n)
                reg_rows<F, kRegOut>(x, ldx, rows, w + o0 * ldw, ldw, nb, out + o0, n);
            else
                reg_rows<F, 1>(x, ldx, rows, w + o0 * ldw, ldw, nb, out + o0, n);
        }
    });
}

}  // namespace

void gguf_linear_avx2(const float* x, int64_t ldx, int64_t rows, const uint8_t* w, int64_t n,
                      int64_t nb, int64_t format, float* out) {
    with_format(format, [&](auto F) {
        constexpr int64_t f = decltype(F)::value;
        if (rows >= tile_min_rows(f))
            gguf_tiled<f>(x, ldx, rows, w, n, nb, out);
        else
            in_registers<f>(x, ldx, rows, w, n, nb, out);
    });
}
#endif

}  // namespace quant
}  // namespace paternoster
