// gguf_linear_q8 past a few rows (cpu_gguf_q8.cpp calls it from gemm_min_rows): x rounded
// to 8 bits a block as there, but the int32 lanes of a vector are weight rows (a panel), not
// parts of one row's block. The one-row-per-vector kernel pays two float ops a block for each
// (row of x, weight row) pair, to scale its partial sums, which is as much as the exact kernel's
// FMAs past 4 rows. Here each integer multiply takes 4 codes of every panel row times the same
// 4 codes of x (broadcast), and the scaling is one multiply and one FMA a block for the whole
// panel.
//
// That needs the weights in another order: each call repacks a panel (its rows x k codes: 24 KB
// at k = 1536 for 16 rows, in L1) and runs every row of x against it. The stored weights keep
// the file's layout, which the exact kernels and the GEMM path read, unless they were stored
// as panels (`panels`; kernels/quant_reference.py `pack_panels`, the same bytes: per block of
// a panel, its rows' code dwords one dword index after another, then their heads), which only
// x's 8-bit kernels and a tied embedding's lookup read. Each pass of rows then widens a stored
// panel's codes in registers as it loads them (`rows` on the bytes): no transpose, and no
// Panel written to L1 and read back. On the bundled file's 210 Q4_1 projections (VNNI, 1
// thread, Zen 4, ms) against the file's layout: 3.8 / 7.2 at 1 row (the one-row kernel), 5.4 /
// 16.1 at 4, 9.9 / 18.7 at 8, 34.0 / 39.2 at 32, 62.3 / 69.4 at 64; 35 projections at 512 rows
// 76.7 / 83.4 (ops/bench/quant_linear.py: q4_1@int8 / q4_1_a8). AVX2's 8-row panels:
// cpu_gguf_q8_gemm_avx2.cpp.
//
// This header holds what every ISA shares: x's codes and the loop over panels. An ISA is a
// struct (cpu_gguf_q8_gemm.cpp: AVX-512 VNNI; cpu_gguf_q8_gemm_avx2.cpp: AVX2's maddubs) with
// kPanel, kXRows, a Panel type, pack<F>(w, ldw, nb, panel) of kPanel whole rows, and
// rows<F, R>(panel, xc, r, out, ldo, valid), on a Panel or on a stored panel's bytes.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu_q8_vec.h"

namespace paternoster {
namespace quant {

constexpr int64_t kGroups = kBlock / 4;  // 4-code groups a block: one integer dot product each

// x's codes in element order, and per block dx, dx * sum(a) (Q4_1's mins) and
// -offset * sum(a) (Q4_0's 8, VNNI's Q8_0 128: the integer dot products start from it).
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

// A panel repacked: per block, kGroups vectors V of codes (lane i: weight row i's 4 codes of
// the group) and the rows' d and m (Q4_1's mins), `Rows` floats each.
template <class V, int64_t Rows>
struct PanelOf {
    std::vector<V> codes;
    std::vector<float> d, m;
    void resize(int64_t nb) {
        codes.resize(nb * kGroups);
        d.resize(nb * Rows);
        m.resize(nb * Rows);
    }
};

// Block b of a packed PanelOf<V, Rows>, as an ISA's `products` reads it (the ISA's Stored reads
// a stored panel's bytes the same way): code vector g (lane i: weight row i's 4 codes of the
// block's group g), and the rows' d and m (Q4_1's mins) as VF, a float vector of Rows lanes.
template <class V, int64_t Rows, class VF>
struct PackedOf {
    static_assert(sizeof(VF) == Rows * sizeof(float), "VF holds one float a weight row");
    const PanelOf<V, Rows>& p;
    template <int64_t F>
    V codes(int64_t b, int64_t g) const { return p.codes[b * kGroups + g]; }
    template <int64_t F>
    void scales(int64_t b, VF& d, VF& m) const {
        std::memcpy(&d, &p.d[b * Rows], sizeof(VF));
        if constexpr (F == kQ4_1) std::memcpy(&m, &p.m[b * Rows], sizeof(VF));
    }
};

// Block b of a stored panel of `Rows` weight rows (kernels/quant_reference.py `pack_panels`):
// the rows' code dwords for each word w, one vector of `Rows` int32 lanes each (4-bit: 4 words,
// whose low nibbles are groups 0-3 and high ones 4-7; Q8_0: 8), then the rows' heads (Q4_1's
// (d, m) dwords, the others' d halves). Where things lie, for each ISA's Stored, which widens
// the codes and reads the heads in its own registers.
template <int64_t Rows>
struct StoredPanel {
    static constexpr int64_t kWordBytes = 4 * Rows;  // a row's 4 codes of one group
    template <int64_t F>
    static constexpr int64_t kWords = F == kQ8_0 ? kGroups : kGroups / 2;
    const uint8_t* at;
    template <int64_t F>
    const uint8_t* block(int64_t b) const { return at + b * Rows * block_bytes(F); }
    // The word holding group g's codes: its low nibbles where `low<F>(g)` (4-bit), else its
    // high ones; Q8_0's word is the group's bytes.
    template <int64_t F>
    const uint8_t* word(int64_t b, int64_t g) const {
        return block<F>(b) + kWordBytes * (g % kWords<F>);
    }
    template <int64_t F>
    static constexpr bool low(int64_t g) { return g < kWords<F>; }
    template <int64_t F>
    const uint8_t* heads(int64_t b) const { return block<F>(b) + kWordBytes * kWords<F>; }
};

// Every row of x against the panel (a packed Panel, or a stored one's bytes), Isa::kXRows at a
// time, the last few in a pass of their own.
template <class Isa, int64_t F, int64_t R = Isa::kXRows, class P>
void panel_all(const P& p, const XCodes& xc, int64_t r, int64_t rows, float* out, int64_t ldo,
               int64_t valid) {
    for (; rows >= R; rows -= R, r += R)
        Isa::template rows<F, R>(p, xc, r, out + r * ldo, ldo, valid);
    if constexpr (R > 1)
        if (rows > 0) panel_all<Isa, F, R - 1>(p, xc, r, rows, out, ldo, valid);
}

// out (rows, n) = x @ W.T, W's n rows of nb blocks of format F, a panel a task.
template <class Isa, int64_t F>
void panel_gemm(const float* x, int64_t ldx, int64_t rows, const uint8_t* w, int64_t n,
                int64_t nb, bool panels, float* out) {
    thread_local XCodes mine;
    // A reference: a thread_local named inside the lambda would be each pool thread's own.
    const XCodes& xc = mine;
    quantize_x<F>(x, ldx, rows, nb, mine);
    const int64_t ldw = nb * block_bytes(F), panel_rows = Isa::kPanel;
    at::parallel_for(0, (n + panel_rows - 1) / panel_rows, 1, [&](int64_t begin, int64_t end) {
        thread_local typename Isa::Panel panel;
        thread_local std::vector<uint8_t> padded;
        for (int64_t p = begin; p < end; ++p) {
            const int64_t o = p * panel_rows, valid = std::min(panel_rows, n - o);
            const uint8_t* rows_at = w + o * ldw;
            if (panels) {  // n is a whole number of panels (gguf_linear_q8 checks)
                panel_all<Isa, F>(rows_at, xc, 0, rows, out + o, n, valid);
                continue;
            }
            if (valid < panel_rows) {  // the last panel: its rows copied beside zero ones
                padded.assign(panel_rows * ldw, 0);
                std::copy(rows_at, rows_at + valid * ldw, padded.begin());
                rows_at = padded.data();
            }
            Isa::template pack<F>(rows_at, ldw, nb, panel);
            panel_all<Isa, F>(panel, xc, 0, rows, out + o, n, valid);
        }
    });
}

// `panel_gemm` for a format named at run time: gguf_gemm_q8 (cpu_quant.h) on ISA `Isa`.
template <class Isa>
void panel_gemm_any(const float* x, int64_t ldx, int64_t rows, const uint8_t* w, int64_t n,
                    int64_t nb, int64_t format, bool panels, float* out) {
    with_format(format, [&](auto F) {
        panel_gemm<Isa, decltype(F)::value>(x, ldx, rows, w, n, nb, panels, out);
    });
}

}  // namespace quant
}  // namespace paternoster
