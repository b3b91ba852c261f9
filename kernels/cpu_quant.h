// What the quantized linears share (cpu_quant_linear.cpp: GGUF blocks; cpu_int8_linear.cpp:
// per-channel int8): a 16-float vector, byte widening, and the dot-product tile over rows of x.
#pragma once

#include <ATen/ops/empty.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "cpu_ops.h"

namespace paternoster {
namespace quant {

// GGUF blocks (layouts: kernels/quant_reference.py): 32 weights each, of GGML type `Format`.
constexpr int64_t kBlock = 32;

enum Format : int64_t { kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8 };

constexpr int64_t block_bytes(int64_t format) {
    return format == kQ8_0 ? 34 : format == kQ4_1 ? 20 : 18;
}

inline int32_t load32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

inline float half(const uint8_t* p) {
    uint16_t bits;
    std::memcpy(&bits, p, 2);
    return _cvtsh_ss(bits);  // F16C, on every AVX2 CPU
}

// Blocks (n, row_bytes) uint8 of a format we run; how many blocks a row holds.
inline int64_t checked_blocks(const at::Tensor& blocks, int64_t format) {
    check(blocks, "blocks", at::kByte, 2);
    TORCH_CHECK(blocks.is_contiguous(), "blocks must be contiguous");
    TORCH_CHECK(format == kQ4_0 || format == kQ4_1 || format == kQ8_0, "GGML type ", format,
                " has no kernel here (Q4_0 = 2, Q4_1 = 3, Q8_0 = 8)");
    TORCH_CHECK(blocks.size(1) % block_bytes(format) == 0, "blocks rows must be whole ",
                block_bytes(format), "-byte blocks");
    return blocks.size(1) / block_bytes(format);
}

// Calls fn(std::integral_constant<Format, F>{}) for the format `format` names (checked_blocks
// admits these three): the one list of formats each kernel is instantiated for.
template <class Fn>
inline void with_format(int64_t format, Fn&& fn) {
    switch (format) {
        case kQ8_0: fn(std::integral_constant<Format, kQ8_0>{}); break;
        case kQ4_1: fn(std::integral_constant<Format, kQ4_1>{}); break;
        default: fn(std::integral_constant<Format, kQ4_0>{}); break;
    }
}

// A block of x as 8-bit codes a = round(x / dx), dx = max|x| / 127, rounded to nearest even (the
// default rounding mode), as kernels/quant_reference.py `quantize_activations`; sum(a).
inline int32_t quantize_block(const float* xb, int8_t* a, float& dx) {
    float amax = 0.0f;
    for (int64_t e = 0; e < kBlock; ++e) amax = std::max(amax, std::fabs(xb[e]));
    dx = amax / 127.0f;
    const float inverse = dx > 0.0f ? 1.0f / dx : 0.0f;
    int32_t sum = 0;
    for (int64_t e = 0; e < kBlock; ++e) {
        const float v = std::nearbyint(xb[e] * inverse);
        a[e] = int8_t(std::min(std::max(v, -127.0f), 127.0f));
        sum += a[e];
    }
    return sum;
}

// out (rows, n) = x @ W.T with x rounded as quantize_block, for many rows: cpu_q8_gemm.h's panel
// GEMM, built by cpu_gguf_q8_gemm.cpp (AVX-512 VNNI) or cpu_gguf_q8_gemm_avx2.cpp (without);
// W stored as panels of q8_panel_rows() rows where `panels`.
void gguf_gemm_q8(const float* x, int64_t ldx, int64_t rows, const uint8_t* w, int64_t n,
                  int64_t nb, int64_t format, bool panels, float* out);
// Weight rows of the panels gguf_gemm_q8 reads stored (kernels/quant_reference.py
// `pack_panels`): 16 in the AVX-512 VNNI build (a zmm's int32 lanes), 8 on AVX2 (a ymm's).
int64_t q8_panel_rows();

// Rows of x from which the exact linears run through an fp32 tile (cpu_gguf_tile.h) on either
// ISA, the registers below: int8 weights, and GGUF blocks but for `tile_min_rows`' exception.
// AVX2, the haswell build on a Zen 4 (210 Q4_1 projections, 1 thread, ms), registers / tile:
// 15.9 / 33.1 at 3 rows, 28.3 / 38.1 at 8, 42.9 / 48.3 at 12, 57.0 / 55.4 at 16, 89.0 / 72.4 at
// 24. AVX-512 on an AMX Xeon, 2 threads: Q8_0 25.6 / 26.1 at 12, 32.4 / 33.0 at 16, 65.7 / 57.4
// at 32; int8 weights 27.7 / 29.0 at 16, 47.3 / 36.2 at 24.
constexpr int64_t kTileMinRows = 16;

// GGUF blocks of `format`: on AVX-512, 4-bit blocks from 10 rows, where the registers' passes of 8
// rows dequantize each block twice (AMX Xeon, both in one process, Q4_1 ms, 1 / 2 threads:
// 33.5 / 40.8 and 13.5 / 17.5 at 8 rows; 48.2 / 41.3 and 19.7 / 16.9 at 10; 53.1 / 45.0 and
// 22.8 / 19.3 at 12); Q8_0 ties there (45.0 / 48.9 at 10, 1 thread) and keeps 16.
constexpr int64_t tile_min_rows(int64_t format) {
#if defined(__AVX512F__)
    return format == kQ8_0 ? kTileMinRows : 10;
#else
    return (void)format, kTileMinRows;
#endif
}

// out (rows, n) = x @ W.T exactly (x in fp32), on AVX2 builds only (cpu_gguf_avx2.cpp).
void gguf_linear_avx2(const float* x, int64_t ldx, int64_t rows, const uint8_t* w, int64_t n,
                      int64_t nb, int64_t format, float* out);

// 16 floats: one register on AVX-512, two on AVX2 (gcc splits the vector_size arithmetic).
typedef float f16v __attribute__((vector_size(64)));

#if defined(__AVX512F__)
constexpr int64_t kRows = 8;  // x rows per pass: 8 x 2 accumulators + 4 weight + 2 x of 32 zmm
#else
constexpr int64_t kRows = 2;  // AVX2: 16 ymm; each f16v takes two
#endif
constexpr int64_t kOut = 2;  // weight rows per pass: independent FMA chains at 1 row of x

// Every `rows` of x in passes of Max, each pass calling fn(first row, an
// std::integral_constant of its row count): the last pass, of 1..Max rows, is a kernel
// instantiated for its own count (one row at a time took int8 at 4 rows from 10.3 to 32 ms
// once kRows went to 8).
template <int64_t Max, int64_t R = Max, class Fn>
inline void in_passes(int64_t rows, Fn&& fn) {
    if constexpr (R == Max) {
        int64_t r = 0;
        for (; r + Max <= rows; r += Max) fn(r, std::integral_constant<int64_t, Max>{});
        if constexpr (Max > 1)
            if (r < rows) in_passes<Max, Max - 1>(rows - r, [&](int64_t, auto n) { fn(r, n); });
    } else if (rows == R) {
        fn(int64_t{0}, std::integral_constant<int64_t, R>{});
    } else if constexpr (R > 1) {
        in_passes<Max, R - 1>(rows, fn);
    }
}

inline f16v loadf(const float* p) {
    f16v v;
    std::memcpy(&v, p, sizeof(v));
    return v;
}

inline __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

// 16 bytes as 16 floats: zero-extended (4-bit codes) or sign-extended (int8). Intrinsics,
// because gcc turns __builtin_convertvector of bytes to floats into 16 scalar conversions
// (vcvtusi2ss): the first build spent 1 cycle a weight there, 2.5x fp32's whole time at 1 row.
inline f16v widen(__m128i q, bool is_signed) {
#if defined(__AVX512F__)
    const __m512i i = is_signed ? _mm512_cvtepi8_epi32(q) : _mm512_cvtepu8_epi32(q);
    const __m512 f = _mm512_cvtepi32_ps(i);
#else
    const __m128i q_hi = _mm_srli_si128(q, 8);
    const __m256i i0 = is_signed ? _mm256_cvtepi8_epi32(q) : _mm256_cvtepu8_epi32(q);
    const __m256i i1 = is_signed ? _mm256_cvtepi8_epi32(q_hi) : _mm256_cvtepu8_epi32(q_hi);
    const __m256 f[2] = {_mm256_cvtepi32_ps(i0), _mm256_cvtepi32_ps(i1)};
#endif
    f16v v;
    std::memcpy(&v, &f, sizeof(v));
    return v;
}

// s in all 16 lanes. Spelled out because on AVX2 gcc builds `f16v * float` by storing the
// float 16 times to the stack and reloading it 16 bytes at a time (a store-forwarding stall
// each): the -march=haswell build ran the file's Q4_1 projections at 1 row in 99 ms, 17x the
// AVX-512 build's 5.9 (ops/bench/quant_linear.py --avx2, 1 thread).
inline f16v splat(float s) {
#if defined(__AVX512F__)
    const __m512 f = _mm512_set1_ps(s);
#else
    const __m256 f[2] = {_mm256_set1_ps(s), _mm256_set1_ps(s)};
#endif
    f16v v;
    std::memcpy(&v, &f, sizeof(v));
    return v;
}

// 8 lanes summed by halving (4 + 4, 2 + 2, 1 + 1): hsum's order on one ymm (AVX2's native vector).
inline float hsum8(__m256 v) {
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// The 16 lanes summed by halving (8 + 8, 4 + 4, 2 + 2, 1 + 1), a fixed order, so the same
// inputs round alike; in registers, since R x O of these end every pass (a scalar loop over
// the lanes cost as much as the 18 blocks of a k = 576 row at 8 rows of x).
inline float hsum(f16v v) {
    __m256 half[2];
    std::memcpy(half, &v, sizeof(v));
    return hsum8(_mm256_add_ps(half[0], half[1]));
}

inline f16v load_w(const float* p) { return loadf(p); }
inline f16v load_w(const int8_t* p) { return widen(load16(p), true); }

// out[r * ldo + o] = scale[o] * dot(x row r, w row o) over k (any k; scale null: 1), for R rows
// of x and O rows of w (fp32: a dequantized tile in cache; int8: streamed, so prefetched).
template <typename T, int64_t R, int64_t O>
void dot_block(const float* x, int64_t ldx, const T* w, int64_t ldw, int64_t k,
               const float* scale, float* out, int64_t ldo) {
    f16v acc[R][O] = {};
    const int64_t k_vec = k - k % 16;
    for (int64_t i = 0; i < k_vec; i += 16) {
        f16v wv[O];
        for (int64_t o = 0; o < O; ++o) {
            if constexpr (sizeof(T) == 1) __builtin_prefetch(w + (O + o) * ldw + i);
            wv[o] = load_w(w + o * ldw + i);
        }
        for (int64_t r = 0; r < R; ++r) {
            const f16v xv = loadf(x + r * ldx + i);
            for (int64_t o = 0; o < O; ++o) acc[r][o] += xv * wv[o];
        }
    }
    for (int64_t r = 0; r < R; ++r) {
        for (int64_t o = 0; o < O; ++o) {
            float s = hsum(acc[r][o]);
            for (int64_t i = k_vec; i < k; ++i) s += x[r * ldx + i] * float(w[o * ldw + i]);
            out[r * ldo + o] = scale == nullptr ? s : s * scale[o];
        }
    }
}

// Every rows-of-x group over the same O weight rows.
template <typename T, int64_t O>
void dot_rows(const float* x, int64_t ldx, int64_t rows, const T* w, int64_t ldw, int64_t k,
              const float* scale, float* out, int64_t ldo) {
    in_passes<kRows>(rows, [&](int64_t r, auto n) {
        dot_block<T, decltype(n)::value, O>(x + r * ldx, ldx, w, ldw, k, scale, out + r * ldo,
                                            ldo);
    });
}

// x: float32, 2-D, rows contiguous, k features; the bias (n values) or null.
inline const float* check_x_bias(const at::Tensor& x, int64_t k, int64_t n,
                                 const c10::optional<at::Tensor>& bias) {
    check(x, "x", at::kFloat, 2);
    TORCH_CHECK(x.stride(1) == 1, "x rows must be contiguous");
    TORCH_CHECK(x.size(1) == k, "x has ", x.size(1), " features, weight expects ", k);
    if (!bias.has_value() || !bias->defined()) return nullptr;
    check(*bias, "bias", at::kFloat, 1);
    TORCH_CHECK(bias->is_contiguous() && bias->size(0) == n, "bias must hold ", n, " values");
    return bias->data_ptr<float>();
}

inline void add_bias(float* out, int64_t rows, int64_t n, const float* b) {
    if (b == nullptr) return;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < n; ++o) out[r * n + o] += b[o];
}

// One GGUF linear call: checks, the (rows, n) output, then
// run(format, x, ldx, rows, blocks, n, nb, out) fills it, and the bias is added.
template <typename Run>
at::Tensor gguf_call(const at::Tensor& x, const at::Tensor& blocks, int64_t format,
                     const c10::optional<at::Tensor>& bias, Run run) {
    const int64_t nb = checked_blocks(blocks, format), n = blocks.size(0);
    const float* b = check_x_bias(x, nb * kBlock, n, bias);
    const int64_t rows = x.size(0);
    at::Tensor out = at::empty({rows, n}, x.options().memory_format(at::MemoryFormat::Contiguous));
    float* op = out.data_ptr<float>();
    run(format, x.data_ptr<float>(), x.stride(0), rows, blocks.data_ptr<uint8_t>(), n, nb, op);
    add_bias(op, rows, n, b);
    return out;
}

}  // namespace quant
}  // namespace paternoster
