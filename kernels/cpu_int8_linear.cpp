// y = x @ (scale[:, None] * W).T + b, W per-channel symmetric int8 (made at load from fp32 or
// bf16 weights: kernels/quant_reference.py), for any row count; 1 byte a weight where fp32
// streams 4. Each 16 codes are widened to floats in registers and multiplied into every row.

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include "cpu_gguf_tile.h"

namespace paternoster {
namespace {

using namespace quant;

#if defined(__AVX512F__)
template <int64_t O>
void int8_rows(const float* x, int64_t ldx, int64_t rows, const int8_t* w, int64_t k,
               const float* scale, float* out, int64_t ldo) {
    dot_rows<int8_t, O>(x, ldx, rows, w, k, k, scale, out, ldo);
}
#else
// AVX2: native ymm. cpu_quant.h's dot_block works in 16-float vectors, two ymm each here, and
// gcc kept their accumulators on the stack (as it did in the GGUF kernel: cpu_gguf_avx2.cpp);
// the haswell build's 1-row pass over SmolLM2's 210 projections took 44.2 ms there, fp32 21.9.
// Two accumulators per (row, weight row) pair: even and odd 8 codes of each 16.
template <int64_t R, int64_t O>
void int8_block(const float* x, int64_t ldx, const int8_t* w, int64_t k, const float* scale,
                float* out, int64_t ldo) {
    __m256 acc[R][O][2];
    for (int64_t r = 0; r < R; ++r)
        for (int64_t o = 0; o < O; ++o) acc[r][o][0] = acc[r][o][1] = _mm256_setzero_ps();
    const int64_t k_vec = k - k % 16;
    for (int64_t i = 0; i < k_vec; i += 16) {
        for (int64_t h = 0; h < 2; ++h) {
            __m256 wv[O];
            for (int64_t o = 0; o < O; ++o) {
                const int8_t* at = w + o * k + i + 8 * h;
                if (h == 0) __builtin_prefetch(at + O * k);  // streamed: the next O rows
                const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(at));
                wv[o] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
            }
            for (int64_t r = 0; r < R; ++r) {
                const __m256 xv = _mm256_loadu_ps(x + r * ldx + i + 8 * h);
                for (int64_t o = 0; o < O; ++o)
                    acc[r][o][h] = _mm256_fmadd_ps(xv, wv[o], acc[r][o][h]);
            }
        }
    }
    for (int64_t r = 0; r < R; ++r) {
        for (int64_t o = 0; o < O; ++o) {
            float s = hsum8(_mm256_add_ps(acc[r][o][0], acc[r][o][1]));
            for (int64_t i = k_vec; i < k; ++i) s += x[r * ldx + i] * float(w[o * k + i]);
            out[r * ldo + o] = s * scale[o];
        }
    }
}

template <int64_t O>
void int8_rows(const float* x, int64_t ldx, int64_t rows, const int8_t* w, int64_t k,
               const float* scale, float* out, int64_t ldo) {
    in_passes<kRows>(rows, [&](int64_t r, auto n) {
        int8_block<decltype(n)::value, O>(x + r * ldx, ldx, w, k, scale, out + r * ldo, ldo);
    });
}
#endif

}  // namespace

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                       const c10::optional<at::Tensor>& bias) {
    check(weight, "weight", at::kChar, 2);
    TORCH_CHECK(weight.is_contiguous(), "weight must be contiguous");
    const int64_t n = weight.size(0), k = weight.size(1);
    check(scale, "scale", at::kFloat, 1);
    TORCH_CHECK(scale.is_contiguous() && scale.size(0) == n, "scale must hold ", n, " values");
    const float* b = check_x_bias(x, k, n, bias);
    const int64_t rows = x.size(0), ldx = x.stride(0);
    at::Tensor out = at::empty({rows, n}, x.options().memory_format(at::MemoryFormat::Contiguous));
    const float* xp = x.data_ptr<float>();
    const int8_t* wp = weight.data_ptr<int8_t>();
    const float* sp = scale.data_ptr<float>();
    float* op = out.data_ptr<float>();
    if (rows >= kTileMinRows && k % TileVec::kWidth == 0) {
        // Many rows: each weight row widened once per call into cpu_gguf_tile.h's tile, not once
        // per pass of kRows rows; the row's scale after the dot, as below.
        auto fill = [&](int64_t o, float* dst) {
            const int8_t* q = wp + o * k;
            for (int64_t i = 0; i < k; ++i) dst[i] = float(q[i]);
        };
        tiled<TileVec, kTileOut, kTileRows>(xp, ldx, rows, n, k, fill, sp, op);
    } else {
        // Threads split the weight rows, so each streams its part of W once.
        at::parallel_for(0, (n + kOut - 1) / kOut, 16, [&](int64_t begin, int64_t end) {
            for (int64_t p = begin; p < end; ++p) {
                const int64_t o0 = p * kOut;
                const int8_t* w = wp + o0 * k;
                if (o0 + kOut <= n)
                    int8_rows<kOut>(xp, ldx, rows, w, k, sp + o0, op + o0, n);
                else
                    int8_rows<1>(xp, ldx, rows, w, k, sp + o0, op + o0, n);
            }
        });
    }
    add_bias(op, rows, n, b);
    return out;
}

}  // namespace paternoster
