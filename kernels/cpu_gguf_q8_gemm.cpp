// gguf_linear_q8 past a few rows (cpu_gguf_q8.cpp calls it from kGemmMinRows rows), on
// AVX-512 VNNI only: x rounded to 8 bits a block, as there, but the int32 lanes are 16 weight
// rows, not parts of one row's block. The one-row-per-vector kernel pays two float ops a block
// for each (row of x, weight row) pair, to scale its partial sums, which is as much as the exact
// kernel's FMAs past 4 rows. Here one vpdpbusd multiplies 4 codes of 16 weight rows by the same 4
// codes of x (broadcast), 8 of them cover a block, and the scaling is one multiply and one FMA a
// block for all 16 weight rows: 4x fewer float ops per product.
//
// That needs the weights in another order: each call repacks 16 weight rows at a time (a panel,
// 16 x k codes: 24 KB at k = 1536, in L1) with gathers, and runs every row of x against it. The
// stored weights keep the file's layout, which the exact kernels, the GEMM path and the
// embedding read.

#include <ATen/Parallel.h>

#include <vector>

#include "cpu_q8_vec.h"

namespace paternoster {
namespace quant {

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
namespace {

constexpr int64_t kPanel = 16;           // weight rows a panel: one int32 lane each
constexpr int64_t kGroups = kBlock / 4;  // 4-code groups a block: one vpdpbusd each
constexpr int64_t kXRows = 4;            // rows of x per pass: 4 int + 4 float accumulators

// x's codes in element order, and per block dx, dx * sum(a) (Q4_1's mins) and
// -offset * sum(a) (Q4_0's 8, Q8_0's 128: the integer dot products start from it).
struct XCodes {
    int64_t nb = 0;
    std::vector<int8_t> a;
    std::vector<float> dx, sdx;
    std::vector<int32_t> init;
};

template <int64_t F>
void quantize_x(const float* x, int64_t ldx, int64_t rows, int64_t nb, XCodes& xc) {
    constexpr int32_t offset = int32_t(q8::kOffset<F>);  // the same codes as the one-row kernel's
    xc.nb = nb;
    xc.a.resize(rows * nb * kBlock);
    xc.dx.resize(rows * nb);
    xc.sdx.resize(rows * nb);
    xc.init.resize(rows * nb);
    at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin * nb; i < end * nb; ++i) {
            const int64_t r = i / nb, b = i % nb;
            float d;
            const int32_t sum = quantize_block(x + r * ldx + b * kBlock, &xc.a[i * kBlock], d);
            xc.dx[i] = d;
            xc.sdx[i] = d * float(sum);
            xc.init[i] = -offset * sum;
        }
    });
}

// kPanel weight rows (`rows` of them real, the rest zero) repacked: per block, kGroups x 64
// bytes of unsigned codes (lane i: row i's 4 codes of the group) and the rows' d and m.
struct Panel {
    std::vector<__m512i> codes;
    std::vector<float> d, m;
};

template <int64_t F>
void pack_panel(const uint8_t* w, int64_t ldw, int64_t rows, int64_t nb, Panel& p) {
    p.codes.resize(nb * kGroups);
    p.d.resize(nb * kPanel);
    p.m.resize(nb * kPanel);
    // Row i at byte offset i * ldw; missing rows gather nothing (mask) and stay zero.
    const __m512i offsets = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(int32_t(ldw)));
    const __mmask16 live = __mmask16((1u << rows) - 1);
    const __m512i zero = _mm512_setzero_si512(), low4 = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w + b * block_bytes(F);
        const __m512i head = _mm512_mask_i32gather_epi32(zero, live, offsets, blk, 1);
        // d in each dword's low half; Q4_1's m in its high half
        _mm512_storeu_ps(&p.d[b * kPanel], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head)));
        if constexpr (F == kQ4_1)
            _mm512_storeu_ps(&p.m[b * kPanel],
                             _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16))));
        __m512i* out = &p.codes[b * kGroups];
        if constexpr (F == kQ8_0) {
            for (int64_t g = 0; g < kGroups; ++g) {
                const uint8_t* at4 = blk + 2 + 4 * g;
                const __m512i q = _mm512_mask_i32gather_epi32(zero, live, offsets, at4, 1);
                out[g] = _mm512_xor_si512(q, _mm512_set1_epi8(char(0x80)));  // + 128, unsigned
            }
        } else {
            // Byte j holds element j (low nibble) and j + 16 (high): group g and g + 4.
            const uint8_t* qs = blk + (F == kQ4_1 ? 4 : 2);
            for (int64_t g = 0; g < kGroups / 2; ++g) {
                const __m512i q = _mm512_mask_i32gather_epi32(zero, live, offsets, qs + 4 * g, 1);
                out[g] = _mm512_and_si512(q, low4);
                out[g + kGroups / 2] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
            }
        }
    }
}

// out[j * ldo + i] for R rows of x (from r) and the panel's `valid` weight rows i.
template <int64_t F, int64_t R>
void panel_rows(const Panel& p, const XCodes& xc, int64_t r, float* out, int64_t ldo,
                int64_t valid) {
    const int64_t nb = xc.nb;
    __m512 acc[R];
    for (int64_t j = 0; j < R; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        __m512i dots[R];
        for (int64_t j = 0; j < R; ++j) dots[j] = _mm512_set1_epi32(xc.init[(r + j) * nb + b]);
        for (int64_t g = 0; g < kGroups; ++g) {
            const __m512i w = p.codes[b * kGroups + g];
            for (int64_t j = 0; j < R; ++j) {
                const int8_t* a = &xc.a[((r + j) * nb + b) * kBlock + 4 * g];
                dots[j] = _mm512_dpbusd_epi32(dots[j], w, _mm512_set1_epi32(load32(a)));
            }
        }
        const __m512 d = _mm512_loadu_ps(&p.d[b * kPanel]);
        for (int64_t j = 0; j < R; ++j) {
            const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(xc.dx[(r + j) * nb + b]));
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[j]), scale, acc[j]);
        }
        if constexpr (F == kQ4_1) {
            const __m512 m = _mm512_loadu_ps(&p.m[b * kPanel]);
            for (int64_t j = 0; j < R; ++j)
                acc[j] = _mm512_fmadd_ps(m, _mm512_set1_ps(xc.sdx[(r + j) * nb + b]), acc[j]);
        }
    }
    const __mmask16 live = __mmask16((1u << valid) - 1);
    for (int64_t j = 0; j < R; ++j) _mm512_mask_storeu_ps(out + j * ldo, live, acc[j]);
}

// Every row of x against the panel, kXRows at a time, the last 1-3 in a pass of their own.
template <int64_t F, int64_t R = kXRows>
void panel_all(const Panel& p, const XCodes& xc, int64_t r, int64_t rows, float* out,
               int64_t ldo, int64_t valid) {
    for (; rows >= R; rows -= R, r += R) panel_rows<F, R>(p, xc, r, out + r * ldo, ldo, valid);
    if constexpr (R > 1)
        if (rows > 0) panel_all<F, R - 1>(p, xc, r, rows, out, ldo, valid);
}

template <int64_t F>
void gemm(const float* x, int64_t ldx, int64_t rows, const uint8_t* w, int64_t n, int64_t nb,
          float* out) {
    thread_local XCodes mine;
    // A reference: a thread_local named inside the lambda would be each pool thread's own.
    const XCodes& xc = mine;
    quantize_x<F>(x, ldx, rows, nb, mine);
    const int64_t ldw = nb * block_bytes(F);
    at::parallel_for(0, (n + kPanel - 1) / kPanel, 1, [&](int64_t begin, int64_t end) {
        thread_local Panel panel;
        for (int64_t p = begin; p < end; ++p) {
            const int64_t o = p * kPanel, valid = std::min(kPanel, n - o);
            pack_panel<F>(w + o * ldw, ldw, valid, nb, panel);
            panel_all<F>(panel, xc, 0, rows, out + o, n, valid);
        }
    });
}

}  // namespace

bool gguf_gemm_q8(const float* x, int64_t ldx, int64_t rows, const uint8_t* w, int64_t n,
                  int64_t nb, int64_t format, float* out) {
    with_format(format, [&](auto F) { gemm<decltype(F)::value>(x, ldx, rows, w, n, nb, out); });
    return true;
}
constexpr bool kBuilt = true;
#else
bool gguf_gemm_q8(const float*, int64_t, int64_t, const uint8_t*, int64_t, int64_t, int64_t,
                  float*) {
    return false;  // no VNNI: cpu_gguf_q8.cpp's kernel takes every row count
}
constexpr bool kBuilt = false;
#endif

}  // namespace quant

bool q8_gemm_built() { return quant::kBuilt; }

}  // namespace paternoster
