// cpu_q8_gemm.h's panel GEMM without VNNI, on AVX2: a panel is 8 weight rows, one int32 lane of
// a ymm each. AVX2 has no vpdpbusd; its vpmaddubsw multiplies unsigned by signed bytes into 16
// int16 sums of two products, and vpmaddwd by ones adds those pairs into the int32 lanes. A 4-bit
// code times an 8-bit one is at most 15 * 127, so a block's 8 groups sum in int16 (8 * 2 * 1905 =
// 30,480 < 32,767) and one vpmaddwd a block widens them: 8 + 8 + 1 integer ops a block where the
// VNNI kernel takes 8. Q8_0's signed codes take llama.cpp's way around maddubs' unsigned side
// (|q| times x with q's sign), and widen every group, as two products of them reach 32,512.
//
// A panel comes from the file's layout transposed per call (`pack`), or from the blocks stored
// as 8-row panels at load (`Stored`), its codes widened in registers as they load. On the
// bundled file's 210 Q4_1 projections (this build on a Zen 4, 1 thread, CPU ms), stored against
// the file's layout (the one-row kernel below 3 rows): 3.4 / 7.7-8.1 at 1 row, 6.2-6.3 /
// 15.7-16.3 at 4, 12.3 / 20.9-21.4 at 8, 24.4-24.7 / 32.9-33.3 at 16, 47.5-47.8 / 51.7-52.4 at
// 32, 90 / 91 at 64, 177-178 / 168-169 at 128 (BENCHMARKS.md, 2026-12-07).

#include "cpu_q8_gemm.h"

namespace paternoster {
namespace quant {

#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__))
namespace {

// 8 rows' dwords: out[g] lane i = row i's dword g of the 16 bytes at `at + i * ldw` (g < G): a
// 4 x 4 dword transpose in each 128-bit lane, lane 0 holding rows 0-3 and lane 1 rows 4-7.
template <int64_t G>
inline void transpose8(const uint8_t* at, int64_t ldw, __m256i* out) {
    __m256i z[4];
    for (int64_t k = 0; k < 4; ++k)
        z[k] = _mm256_set_m128i(load16(at + (k + 4) * ldw), load16(at + k * ldw));
    const __m256i lo01 = _mm256_unpacklo_epi32(z[0], z[1]);
    const __m256i lo23 = _mm256_unpacklo_epi32(z[2], z[3]);
    out[0] = _mm256_unpacklo_epi64(lo01, lo23);
    if constexpr (G > 1) {
        out[1] = _mm256_unpackhi_epi64(lo01, lo23);
        const __m256i hi01 = _mm256_unpackhi_epi32(z[0], z[1]);
        const __m256i hi23 = _mm256_unpackhi_epi32(z[2], z[3]);
        out[2] = _mm256_unpacklo_epi64(hi01, hi23);
        out[3] = _mm256_unpackhi_epi64(hi01, hi23);
    }
}

// The low halves of 8 dwords, each an fp16, as 8 floats.
inline __m256 low_halves(__m256i v) {
    const __m256i h = _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF));
    const __m256i packed = _mm256_packus_epi32(h, h);  // h0-h3 twice | h4-h7 twice
    return _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08)));
}

// A 4-bit code vector's low nibbles (a block's group g) and high ones (group g + kGroups / 2).
inline __m256i low_nibbles(__m256i q) { return _mm256_and_si256(q, _mm256_set1_epi8(0x0F)); }
inline __m256i high_nibbles(__m256i q) { return low_nibbles(_mm256_srli_epi16(q, 4)); }
inline __m256i load32b(const uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

constexpr int64_t kPanelRows = 8;  // weight rows a panel: one int32 lane of a ymm each

using Panel = PanelOf<__m256i, kPanelRows>;  // codes Q8_0's signed, 4-bit ones 0-15
using Packed = PackedOf<__m256i, kPanelRows, __m256>;

// A stored panel's block b (`StoredPanel`), 8 rows a ymm. No Panel is written: the codes are
// widened in registers as they load.
struct Stored : StoredPanel<kPanelRows> {
    static_assert(kWordBytes == sizeof(__m256i), "a code word is one vector");
    template <int64_t F>
    __m256i codes(int64_t b, int64_t g) const {
        const __m256i q = load32b(word<F>(b, g));
        if constexpr (F == kQ8_0) return q;
        return low<F>(g) ? low_nibbles(q) : high_nibbles(q);
    }
    template <int64_t F>
    void scales(int64_t b, __m256& d, __m256& m) const {
        const uint8_t* h = heads<F>(b);
        if constexpr (F == kQ4_1) {  // 8 (d, m) dwords: one shuffle puts d0-3 m0-3 | d4-7 m4-7
            const __m256i order = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11,
                                                   14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7,
                                                   10, 11, 14, 15);
            const __m256i dm = _mm256_permute4x64_epi64(
                _mm256_shuffle_epi8(load32b(h), order), 0xD8);  // d0-7 | m0-7
            d = _mm256_cvtph_ps(_mm256_castsi256_si128(dm));
            m = _mm256_cvtph_ps(_mm256_extracti128_si256(dm, 1));
        } else {  // 8 d halves
            d = _mm256_cvtph_ps(load16(h));
        }
    }
};

// out[j * ldo + i] for R rows of x (from r) and the panel's `valid` weight rows i, the panel's
// blocks as `src` gives them (Packed or Stored).
template <int64_t F, int64_t R, class Src>
void products(const Src& src, const XCodes& xc, int64_t r, float* out, int64_t ldo,
              int64_t valid) {
    const int64_t nb = xc.nb;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[R];
    for (int64_t j = 0; j < R; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const int8_t* a[R];
        __m256i dots[R];
        for (int64_t j = 0; j < R; ++j) {
            a[j] = &xc.a[((r + j) * nb + b) * kBlock];
            // Q4_1's codes and AVX2's Q8_0 have no offset: their init is 0, not worth a load.
            dots[j] = q8::kOffset<F> == 0 ? _mm256_setzero_si256()
                                          : _mm256_set1_epi32(xc.init[(r + j) * nb + b]);
        }
        if constexpr (F == kQ8_0) {  // the one-row kernel's AVX2 product, cpu_q8_vec.h
            for (int64_t g = 0; g < kGroups; ++g) {
                const __m256i w = src.template codes<F>(b, g);
                for (int64_t j = 0; j < R; ++j) {
                    const __m256i x4 = _mm256_set1_epi32(load32(a[j] + 4 * g));
                    dots[j] = q8::dot<F>(w, x4, dots[j]);
                    __asm__("" : "+x"(dots[j]));  // as sums[j] below
                }
            }
        } else {
            __m256i sums[R];
            for (int64_t j = 0; j < R; ++j) sums[j] = _mm256_setzero_si256();
            for (int64_t g = 0; g < kGroups; ++g) {
                const __m256i w = src.template codes<F>(b, g);
                for (int64_t j = 0; j < R; ++j) {
                    const __m256i x4 = _mm256_set1_epi32(load32(a[j] + 4 * g));
                    sums[j] = _mm256_add_epi16(sums[j], _mm256_maddubs_epi16(w, x4));
                    // Kept a running sum in its register: integer adds reassociate, and gcc
                    // otherwise made all 32 products of a block first, spilled 18 of them to
                    // the stack, and summed them as a tree (the accumulators in memory too).
                    // With the zero init above: 210 Q4_1 projections as stored panels, 1
                    // thread, ms, 30.3-31.2 -> 24.4-24.7 at 16 rows, 111-116 -> 90 at 64,
                    // 223-224 -> 177-178 at 128; this alone gave 111-113 -> 99 at 64.
                    __asm__("" : "+x"(sums[j]));
                }
            }
            for (int64_t j = 0; j < R; ++j)
                dots[j] = _mm256_add_epi32(dots[j], _mm256_madd_epi16(sums[j], ones));
        }
        __m256 d, m;
        src.template scales<F>(b, d, m);
        for (int64_t j = 0; j < R; ++j) {
            const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(xc.dx[(r + j) * nb + b]));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[j]), scale, acc[j]);
            if constexpr (F == kQ4_1)
                acc[j] = _mm256_fmadd_ps(m, _mm256_set1_ps(xc.sdx[(r + j) * nb + b]), acc[j]);
        }
    }
    const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(int32_t(valid)),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int64_t j = 0; j < R; ++j) _mm256_maskstore_ps(out + j * ldo, live, acc[j]);
}

struct Avx2 {
    static constexpr int64_t kPanel = kPanelRows;
    static constexpr int64_t kXRows = 4;  // 4 int16 + 4 float accumulators of 16 ymm

    using Panel = quant::Panel;

    template <int64_t F>
    static void pack(const uint8_t* w, int64_t ldw, int64_t nb, Panel& p) {
        p.resize(nb);
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t* blk = w + b * block_bytes(F);
            __m256i head;
            transpose8<1>(blk, ldw, &head);
            _mm256_storeu_ps(&p.d[b * kPanel], low_halves(head));
            if constexpr (F == kQ4_1)  // m in each dword's high half
                _mm256_storeu_ps(&p.m[b * kPanel], low_halves(_mm256_srli_epi32(head, 16)));
            __m256i* out = &p.codes[b * kGroups];
            if constexpr (F == kQ8_0) {
                transpose8<4>(blk + 2, ldw, out);
                transpose8<4>(blk + 18, ldw, out + 4);
            } else {  // byte j holds element j (low nibble) and j + 16 (high): groups g, g + 4
                __m256i q[4];
                transpose8<4>(blk + (F == kQ4_1 ? 4 : 2), ldw, q);
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
    panel_gemm_any<Avx2>(x, ldx, rows, w, n, nb, format, panels, out);
}

int64_t q8_panel_rows() { return Avx2::kPanel; }
#endif  // with VNNI: cpu_gguf_q8_gemm.cpp

}  // namespace quant

}  // namespace paternoster
