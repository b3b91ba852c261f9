// y = x @ W.T + b for the few rows of a decode step, reading the plain row-major weight once.
//
// A decode step of a small model on a CPU is bound by reading the weights: 425 MB of fp32 for
// SmolLM2-135M's 121 projections, while 1-16 rows of activations fit in L1. oneDNN's packed
// GEMM is built for many rows and MKL's gemv for exactly one; between them, at 2-16 rows, each
// left a step at 1.3-2x the time its weight bytes take to stream (ops/bench/cpu_linear.py). Here
// every weight element is loaded once from memory and multiplied into every row while it sits in
// a register: a block of 4 weight rows stays in L1 while all row groups pass over it.

#include "cpu_ops.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

namespace paternoster {
namespace {

// One SIMD register of floats: gcc lowers vector_size arithmetic to AVX-512 or AVX2 FMAs.
#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
constexpr int64_t kRows = 4;  // x rows per pass: 4 rows x 4 weight rows = 16 of 32 registers
#else
constexpr int64_t kLanes = 8;
constexpr int64_t kRows = 2;  // AVX2 has 16 registers: 8 accumulators, 4 weight and 2 x loads
#endif
constexpr int64_t kOut = 4;  // weight rows per block
typedef float vec __attribute__((vector_size(kLanes * sizeof(float))));

inline vec load(const float* p) {
    vec v;
    std::memcpy(&v, p, sizeof(vec));  // an unaligned vector load
    return v;
}

// The sum of a vector's lanes by halving: log2(lanes) adds, a fixed order (so the same inputs
// always round alike), independent across the accumulators that call it. The first version
// added the 16 lanes one after another, once per 256-float chunk: 16 dependent adds per dot
// product, and at 4-16 rows those adds, not the weights, bounded the kernel (1 thread on a
// Xeon with AVX-512: 57 ms per step at 4 rows, oneDNN's packed GEMM 42 ms).
template <int64_t N>
inline float hsum_lanes(const float* lanes) {
    if constexpr (N == 1) {
        return lanes[0];
    } else {
        typedef float half __attribute__((vector_size(N / 2 * sizeof(float))));
        half lo, hi;
        std::memcpy(&lo, lanes, sizeof(half));
        std::memcpy(&hi, lanes + N / 2, sizeof(half));
        const half sum = lo + hi;
        return hsum_lanes<N / 2>(reinterpret_cast<const float*>(&sum));
    }
}

inline float hsum(vec v) { return hsum_lanes<kLanes>(reinterpret_cast<const float*>(&v)); }

// out[r * ldo + o] = dot(x row r, w row o) over k features, for R rows and O weight rows: one
// vector accumulator per dot product across the whole of k, reduced once at the end. `ahead`
// is the next block of weights (contiguous, O * k floats): while this one is multiplied, its
// cache lines are asked for at the pace this block consumes its own, O lines per step.
template <int64_t R, int64_t O>
void block(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t k, float* out,
           int64_t ldo, const float* ahead) {
    vec acc[R][O] = {};
    const int64_t k_vec = k - k % kLanes;
    for (int64_t i = 0; i < k_vec; i += kLanes) {
        for (int64_t o = 0; o < O; ++o) __builtin_prefetch(ahead + i * O + o * kLanes);
        vec wv[O];
        for (int64_t o = 0; o < O; ++o) wv[o] = load(w + o * ldw + i);
        for (int64_t r = 0; r < R; ++r) {
            const vec xv = load(x + r * ldx + i);
            for (int64_t o = 0; o < O; ++o) acc[r][o] += xv * wv[o];
        }
    }
    for (int64_t r = 0; r < R; ++r) {
        for (int64_t o = 0; o < O; ++o) {
            float s = hsum(acc[r][o]);
            for (int64_t i = k_vec; i < k; ++i) s += x[r * ldx + i] * w[o * ldw + i];
            out[r * ldo + o] = s;
        }
    }
}

// Every row group passes over one block of O weight rows (4 x 1536 floats, 24 KB at most) while
// it sits in L1; the activation rows (16 x 1536 floats at most) come from L2.
template <int64_t O>
void rows_block(const float* x, int64_t ldx, int64_t rows, const float* w, int64_t ldw, int64_t k,
                float* out, int64_t ldo) {
    const float* ahead = w + O * ldw;
    int64_t r = 0;
    for (; r + kRows <= rows; r += kRows)
        block<kRows, O>(x + r * ldx, ldx, w, ldw, k, out + r * ldo, ldo, ahead);
    for (; r < rows; ++r) block<1, O>(x + r * ldx, ldx, w, ldw, k, out + r * ldo, ldo, ahead);
}

}  // namespace

at::Tensor skinny_linear(const at::Tensor& x, const at::Tensor& weight,
                         const c10::optional<at::Tensor>& bias) {
    check(x, "x", at::kFloat, 2);
    check(weight, "weight", at::kFloat, 2);
    TORCH_CHECK(x.stride(1) == 1, "x rows must be contiguous");
    TORCH_CHECK(weight.is_contiguous(), "weight must be contiguous");
    const int64_t rows = x.size(0), k = x.size(1), n = weight.size(0);
    TORCH_CHECK(weight.size(1) == k, "x has ", k, " features, weight expects ", weight.size(1));
    const float* b = nullptr;
    if (bias.has_value() && bias->defined()) {
        check(*bias, "bias", at::kFloat, 1);
        TORCH_CHECK(bias->is_contiguous() && bias->size(0) == n, "bias must hold ", n, " values");
        b = bias->data_ptr<float>();
    }
    at::Tensor out = at::empty({rows, n}, x.options().memory_format(at::MemoryFormat::Contiguous));
    const float* xp = x.data_ptr<float>();
    const float* wp = weight.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const int64_t ldx = x.stride(0);
    // Threads split the weight rows (output features), so each streams its own part of W once.
    // A grain of 64 rows keeps every projection here (576-3072 outputs) on all threads.
    at::parallel_for(0, (n + kOut - 1) / kOut, 16, [&](int64_t begin, int64_t end) {
        for (int64_t blk = begin; blk < end; ++blk) {
            const int64_t o0 = blk * kOut, width = std::min(kOut, n - o0);
            const float* w = wp + o0 * k;
            float* dst = op + o0;
            switch (width) {
                case 4: rows_block<4>(xp, ldx, rows, w, k, k, dst, n); break;
                case 3: rows_block<3>(xp, ldx, rows, w, k, k, dst, n); break;
                case 2: rows_block<2>(xp, ldx, rows, w, k, k, dst, n); break;
                default: rows_block<1>(xp, ldx, rows, w, k, k, dst, n); break;
            }
            if (b != nullptr) {
                for (int64_t r = 0; r < rows; ++r)
                    for (int64_t o = 0; o < width; ++o) dst[r * n + o] += b[o0 + o];
            }
        }
    });
    return out;
}

}  // namespace paternoster
