// y = x @ W.T + b with W's GGUF blocks (Q8_0, Q4_0, Q4_1) and x rounded to 8 bits a 32-value
// block (`--quant-activations int8`; math and reference: kernels/quant_reference.py
// `quant_linear_q8`). llama.cpp multiplies this way: a block's 32 products are integer dot
// products (VNNI's vpdpbusd: 64 byte products into 16 int32 lanes, one instruction), then
// scaled once by d * dx. gguf_linear (exact, cpu_quant_linear.cpp) instead widens every code to
// a float and spends 2 FMAs a block per row: at 1 row on a 2-core Xeon it ran the bundled file's
// 210 Q4_1 projections in 10.4 ms, bound by that arithmetic, not by their 66 MB; this kernel
// 7.2 (ops/bench/quant_linear.py, 1 thread).
//
// This file's kernel takes 1-2 rows of x: a step is two blocks on AVX-512 (one zmm of 64
// codes; int32 lanes 0-7 the first block's, 8-15 the second's) and one on AVX2 (a ymm; maddubs
// + madd instead of vpdpbusd), primitives in cpu_q8_vec.h. More rows go to the panel GEMM
// (cpu_q8_gemm.h), whose lanes are weight rows instead, and so do all rows of blocks stored as
// panels (`--quant-activations int8`: the GEMM beat this kernel at 1 row on both ISAs once it
// no longer transposed per call). vpdpbusd multiplies unsigned by signed bytes: 4-bit codes
// are unsigned already, Q8_0's get +128 (undone by the block's offset, -128 d); AVX2's maddubs
// would saturate on those, so it takes |q| and moves q's sign onto x (vpsignb), as llama.cpp
// does.

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <vector>

#include "cpu_q8_vec.h"

namespace paternoster {
namespace {

using namespace quant;
using namespace q8;

// Rows from which gguf_gemm_q8 runs. The file's 210 projections, this kernel / the GEMM (ms,
// ops/bench/quant_linear.py, 1 thread, both builds on one AMX Xeon, 2026-12-05):
// - AVX2, Q4_1: 18.6 / 17.4 at 3 rows, 21.8 / 19.1 at 4 (Zen 3: 18.1 / 16.2 at 3);
// - AVX2, Q8_0 (which widens every group): 21.0 / 21.7 at 3, 21.6 / 24.8 at 4, 28.9 / 28.3 at
//   6, 40.0 / 32.9 at 8 (Zen 3: 15.8 / 20.7 at 3, 37.6 / 35.4 at 8);
// - AVX-512 VNNI, Q4_1: 10.9 / 12.6 at 3, 11.8 / 13.5 at 4, 18.5 / 15.1 at 6; Q8_0: 14.9 / 17.1
//   at 3, 15.4 / 18.1 at 4, 20.8 / 19.8 at 6.
constexpr int64_t gemm_min_rows([[maybe_unused]] int64_t format) {
#if defined(__AVX512F__)
    return 6;
#else
    return format == kQ8_0 ? 6 : 3;
#endif
}
alignas(64) const uint8_t kZeroBlock[64] = {};  // the missing second block of an odd row

// Where element e of block j of a step sits among the step's codes, and the lane (of the 8 a
// block has) that sums its 4-code group i.
template <bool Interleaved>
constexpr int64_t code_index(int64_t j, int64_t e) {
    return Interleaved ? (e / 16) * 16 * kStep + j * 16 + e % 16 : j * kBlock + e;
}
template <bool Interleaved>
constexpr int64_t lane_index(int64_t j, int64_t i) {
    return Interleaved ? (i / 4) * 4 * kStep + j * 4 + i % 4 : j * 8 + i;
}

// Rows of x as 8-bit codes: per row and step, kStep * 32 codes (in `codes`' order), and in each
// block's 8 lanes its dx, dx * sum(a) / 8 (the lanes sum to Q4_1's min product) and, in one
// lane, -offset * sum(a) (the dot products start from it: Q4_0's and Q8_0's offsets).
struct Acts {
    int64_t steps = 0;
    std::vector<int8_t> a;
    std::vector<float> dx, sx;
    std::vector<int32_t> init;
    const int8_t* codes(int64_t r, int64_t s) const { return &a[(r * steps + s) * kStep * kBlock]; }
    int64_t lane(int64_t r, int64_t s) const { return (r * steps + s) * kLanes; }
};

template <int64_t F>
void quantize_rows(const float* x, int64_t ldx, int64_t rows, int64_t nb, Acts& acts) {
    constexpr bool il = kInterleaved<F>;
    acts.steps = (nb + kStep - 1) / kStep;
    acts.a.assign(rows * acts.steps * kStep * kBlock, 0);  // padding blocks: codes 0, dx 0
    acts.dx.assign(rows * acts.steps * kLanes, 0.0f);
    acts.sx.assign(rows * acts.steps * kLanes, 0.0f);
    acts.init.assign(rows * acts.steps * kLanes, 0);
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < nb; ++b) {
            int8_t q[kBlock];
            float d;
            const int32_t sum = quantize_block(x + r * ldx + b * kBlock, q, d);
            const int64_t s = b / kStep, j = b % kStep;
            int8_t* a = &acts.a[(r * acts.steps + s) * kStep * kBlock];
            for (int64_t e = 0; e < kBlock; ++e) a[code_index<il>(j, e)] = q[e];
            const int64_t lane = acts.lane(r, s);
            for (int64_t i = 0; i < 8; ++i) {
                acts.dx[lane + lane_index<il>(j, i)] = d;
                acts.sx[lane + lane_index<il>(j, i)] = d * float(sum) / 8.0f;
            }
            acts.init[lane + lane_index<il>(j, 0)] = -int32_t(kOffset<F>) * sum;
        }
    }
}

// out[r * ldo + o] for R rows of x (from r0) and O weight rows of nb blocks (ldw bytes apart).
template <int64_t F, int64_t R, int64_t O>
void q8_block(const Acts& acts, int64_t r0, const uint8_t* w, int64_t ldw, int64_t nb,
              float* out, int64_t ldo) {
    Vec acc[R][O];
    for (int64_t r = 0; r < R; ++r)
        for (int64_t o = 0; o < O; ++o) acc[r][o] = zero();
    for (int64_t s = 0; s < acts.steps; ++s) {
        vi q[O];
        Vec d[O], m[O];
        for (int64_t o = 0; o < O; ++o) {
            const uint8_t* b0 = w + o * ldw + s * kStep * block_bytes(F);
            const uint8_t* b1 = kStep == 1 || s * kStep + 1 < nb ? b0 + block_bytes(F) : kZeroBlock;
            __builtin_prefetch(b0 + O * ldw);  // the next O rows, as gguf_block does
            q[o] = codes<F>(b0, b1);
            step_scales<F>(b0, b1, d[o], m[o]);
        }
        for (int64_t r = 0; r < R; ++r) {
            const int64_t lane = acts.lane(r0 + r, s);
            const vi a = iload(acts.codes(r0 + r, s)), init = iload(&acts.init[lane]);
            const Vec dx = load(&acts.dx[lane]), sx = load(&acts.sx[lane]);
            for (int64_t o = 0; o < O; ++o) {
                const Vec t = cvt(dot<F>(q[o], a, init));
                acc[r][o] = fma(t, mul(d[o], dx), acc[r][o]);
                if constexpr (F == kQ4_1) acc[r][o] = fma(m[o], sx, acc[r][o]);
            }
        }
    }
    for (int64_t r = 0; r < R; ++r)
        for (int64_t o = 0; o < O; ++o) out[r * ldo + o] = sum(acc[r][o]);
}

// O weight rows against every row of x, in passes of up to kQRows rows.
template <int64_t F, int64_t O, int64_t R = kQRows>
void q8_rows(const Acts& acts, int64_t r0, int64_t rows, const uint8_t* w, int64_t ldw,
             int64_t nb, float* out, int64_t ldo) {
    for (; rows >= R; rows -= R, r0 += R)
        q8_block<F, R, O>(acts, r0, w, ldw, nb, out + r0 * ldo, ldo);
    if constexpr (R > 1)
        if (rows > 0) q8_rows<F, O, R - 1>(acts, r0, rows, w, ldw, nb, out, ldo);
}

// The last n % kQOut weight rows, one group of their own size.
template <int64_t F, int64_t O = kQOut - 1>
void q8_tail(int64_t left, const Acts& acts, int64_t rows, const uint8_t* w, int64_t ldw,
             int64_t nb, float* out, int64_t ldo) {
    if (left == O)
        q8_rows<F, O>(acts, 0, rows, w, ldw, nb, out, ldo);
    else if constexpr (O > 1)
        q8_tail<F, O - 1>(left, acts, rows, w, ldw, nb, out, ldo);
}

template <int64_t F>
void q8_all(const float* x, int64_t ldx, Acts& acts, int64_t rows, const uint8_t* w, int64_t n,
            int64_t nb, float* out) {
    quantize_rows<F>(x, ldx, rows, nb, acts);
    const int64_t ldw = nb * block_bytes(F);
    at::parallel_for(0, (n + kQOut - 1) / kQOut, 16, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
            const int64_t o0 = p * kQOut;
            if (o0 + kQOut <= n)
                q8_rows<F, kQOut>(acts, 0, rows, w + o0 * ldw, ldw, nb, out + o0, n);
            else
                q8_tail<F>(n - o0, acts, rows, w + o0 * ldw, ldw, nb, out + o0, n);
        }
    });
}

}  // namespace

at::Tensor gguf_linear_q8(const at::Tensor& x, const at::Tensor& blocks, int64_t format,
                          const c10::optional<at::Tensor>& bias, bool panels) {
    TORCH_CHECK(!panels || blocks.size(0) % q8_panel_rows() == 0,
                "blocks stored as panels must be a whole number of panels (", q8_panel_rows(),
                " rows in this build; ", blocks.size(0), " rows)");
    return gguf_call(x, blocks, format, bias,
                     [panels](int64_t f, const float* xp, int64_t ldx, int64_t rows,
                              const uint8_t* wp, int64_t n, int64_t nb, float* op) {
                         // Stored panels: the GEMM at every row count (it no longer packs).
                         if (panels || rows >= gemm_min_rows(f))
                             return gguf_gemm_q8(xp, ldx, rows, wp, n, nb, f, panels, op);
                         thread_local Acts acts;  // reused: 121 calls a token on SmolLM2-135M
                         with_format(f, [&](auto F) {
                             q8_all<decltype(F)::value>(xp, ldx, acts, rows, wp, n, nb, op);
                         });
                     });
}

}  // namespace paternoster
