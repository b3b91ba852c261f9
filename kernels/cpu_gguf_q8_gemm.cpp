// cpu_q8_gemm.h's panel GEMM on AVX-512 VNNI: a panel is 16 weight rows, one int32 lane each;
// one vpdpbusd multiplies 4 codes of the 16 rows by the same 4 codes of x (broadcast), 8 of them
// cover a block, and the scaling is one multiply and one FMA a block for all 16 rows: 4x fewer
// float ops per product than the one-row-per-vector kernel.

#include "cpu_q8_gemm.h"

namespace paternoster {
namespace quant {

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
namespace {

// 16 rows' dwords: out[g] lane i = row i's dword g of the 16 bytes at `at + i * ldw` (g < G).
// A 4 x 4 dword transpose in each 128-bit lane, whose lane L holds rows 4L to 4L + 3: 16 loads
// and 4 + 2G unpacks for what takes G 16-lane gathers, which Zen 4 runs slowly: its q4_1_a8 at
// 8 rows took 36.6 ms with gathers against gguf_linear's 22.3 (ops/bench/quant_linear.py).
template <int64_t G>
inline void transpose_rows(const uint8_t* at, int64_t ldw, __m512i* out) {
    __m512i z[4];
    for (int64_t k = 0; k < 4; ++k) {
        __m512i v = _mm512_castsi128_si512(load16(at + k * ldw));
        v = _mm512_inserti32x4(v, load16(at + (k + 4) * ldw), 1);
        v = _mm512_inserti32x4(v, load16(at + (k + 8) * ldw), 2);
        z[k] = _mm512_inserti32x4(v, load16(at + (k + 12) * ldw), 3);
    }
    const __m512i lo01 = _mm512_unpacklo_epi32(z[0], z[1]);
    const __m512i lo23 = _mm512_unpacklo_epi32(z[2], z[3]);
    out[0] = _mm512_unpacklo_epi64(lo01, lo23);
    if constexpr (G > 1) {
        out[1] = _mm512_unpackhi_epi64(lo01, lo23);
        const __m512i hi01 = _mm512_unpackhi_epi32(z[0], z[1]);
        const __m512i hi23 = _mm512_unpackhi_epi32(z[2], z[3]);
        out[2] = _mm512_unpacklo_epi64(hi01, hi23);
        out[3] = _mm512_unpackhi_epi64(hi01, hi23);
    }
}

// What 16 rows' bytes become, from the file (`pack`) or from stored panels (`rows`): a 4-bit code
// vector's low nibbles (a block's group g) and high ones (group g + kGroups / 2), Q8_0's codes
// made unsigned, and the d (and Q4_1's m) halves of the rows' (d, m) head dwords as floats.
inline __m512i low_nibbles(__m512i q) { return _mm512_and_si512(q, _mm512_set1_epi8(0x0F)); }
inline __m512i high_nibbles(__m512i q) { return low_nibbles(_mm512_srli_epi16(q, 4)); }
inline __m512i unsigned_codes(__m512i q) {
    return _mm512_xor_si512(q, _mm512_set1_epi8(char(0x80)));
}
inline __m512 head_d(__m512i head) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head)); }
inline __m512 head_m(__m512i head) { return head_d(_mm512_srli_epi32(head, 16)); }

constexpr int64_t kPanelRows = 16;  // weight rows a panel: one int32 lane of a zmm each

using Panel = PanelOf<__m512i, kPanelRows>;  // codes unsigned: Q8_0's + 128
using Packed = PackedOf<__m512i, kPanelRows, __m512>;

// A stored panel's block b (`StoredPanel`), 16 rows a zmm. Its codes are widened in registers
// as they load. Expanding them into a Panel first (as `pack` does) and reading that back made a
// row 1.26x the one-row kernel's time on the file's layout (9.1 against 7.2 ms, the bundled
// file's 210 Q4_1 projections streamed from DRAM, 1 thread, Zen 4); this way it is 3.8.
struct Stored : StoredPanel<kPanelRows> {
    static_assert(kWordBytes == sizeof(__m512i), "a code word is one vector");
    template <int64_t F>
    __m512i codes(int64_t b, int64_t g) const {
        const __m512i q = _mm512_loadu_si512(word<F>(b, g));
        if constexpr (F == kQ8_0) return unsigned_codes(q);
        return low<F>(g) ? low_nibbles(q) : high_nibbles(q);
    }
    template <int64_t F>
    void scales(int64_t b, __m512& d, __m512& m) const {
        const uint8_t* h = heads<F>(b);
        if constexpr (F == kQ4_1) {
            const __m512i head = _mm512_loadu_si512(h);
            d = head_d(head);
            m = head_m(head);
        } else {
            d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
        }
    }
};

// out[j * ldo + i] for R rows of x (from r) and the panel's `valid` weight rows i, the panel's
// blocks as `src` gives them (Packed or Stored).
template <int64_t F, int64_t R, class Src>
void products(const Src& src, const XCodes& xc, int64_t r, float* out, int64_t ldo,
              int64_t valid) {
    const int64_t nb = xc.nb;
    __m512 acc[R];
    for (int64_t j = 0; j < R; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const int8_t* a[R];
        __m512i dots[R];
        for (int64_t j = 0; j < R; ++j) {
            a[j] = &xc.a[((r + j) * nb + b) * kBlock];
            dots[j] = _mm512_set1_epi32(xc.init[(r + j) * nb + b]);
        }
        for (int64_t g = 0; g < kGroups; ++g) {
            const __m512i w = src.template codes<F>(b, g);
            for (int64_t j = 0; j < R; ++j)
                dots[j] = _mm512_dpbusd_epi32(dots[j], w, _mm512_set1_epi32(load32(a[j] + 4 * g)));
        }
        __m512 d, m;
        src.template scales<F>(b, d, m);
        for (int64_t j = 0; j < R; ++j) {
            const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(xc.dx[(r + j) * nb + b]));
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[j]), scale, acc[j]);
            if constexpr (F == kQ4_1)
                acc[j] = _mm512_fmadd_ps(m, _mm512_set1_ps(xc.sdx[(r + j) * nb + b]), acc[j]);
        }
    }
    const __mmask16 live = __mmask16((1u << valid) - 1);
    for (int64_t j = 0; j < R; ++j) _mm512_mask_storeu_ps(out + j * ldo, live, acc[j]);
}

struct Avx512Vnni {
    static constexpr int64_t kPanel = kPanelRows;
    static constexpr int64_t kXRows = 4;  // rows of x per pass: 4 int + 4 float accumulators

    using Panel = quant::Panel;

    // 16 whole rows, transposed (`transpose_rows`).
    template <int64_t F>
    static void pack(const uint8_t* w, int64_t ldw, int64_t nb, Panel& p) {
        p.resize(nb);
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t* blk = w + b * block_bytes(F);
            __m512i head;
            transpose_rows<1>(blk, ldw, &head);
            _mm512_storeu_ps(&p.d[b * kPanel], head_d(head));
            if constexpr (F == kQ4_1) _mm512_storeu_ps(&p.m[b * kPanel], head_m(head));
            __m512i* out = &p.codes[b * kGroups];
            if constexpr (F == kQ8_0) {
                transpose_rows<4>(blk + 2, ldw, out);
                transpose_rows<4>(blk + 18, ldw, out + 4);
                for (int64_t g = 0; g < kGroups; ++g) out[g] = unsigned_codes(out[g]);
            } else {
                __m512i q[4];
                transpose_rows<4>(blk + (F == kQ4_1 ? 4 : 2), ldw, q);
                for (int64_t g = 0; g < kGroups / 2; ++g) {
                    out[g] = low_nibbles(q[g]);
                    out[g + kGroups / 2] = high_nibbles(q[g]);
                }
            }
        }
    }

    template <int64_t F, int64_t R>
    static void rows(const Panel& p, const XCodes& xc, int64_t r, float* out, int64_t ldo,
                     int64_t valid) {
        products<F, R>(Packed{p}, xc, r, out, ldo, valid);
    }

    // A stored panel's bytes in place of a Panel (`Stored`).
    template <int64_t F, int64_t R>
    static void rows(const uint8_t* at, const XCodes& xc, int64_t r, float* out, int64_t ldo,
                     int64_t valid) {
        products<F, R>(Stored{{at}}, xc, r, out, ldo, valid);
    }
};

}  // namespace

void gguf_gemm_q8(const float* x, int64_t ldx, int64_t rows, const uint8_t* w, int64_t n,
                  int64_t nb, int64_t format, bool panels, float* out) {
    panel_gemm_any<Avx512Vnni>(x, ldx, rows, w, n, nb, format, panels, out);
}

int64_t q8_panel_rows() { return Avx512Vnni::kPanel; }
#endif  // without VNNI: cpu_gguf_q8_gemm_avx2.cpp

}  // namespace quant
}  // namespace paternoster
