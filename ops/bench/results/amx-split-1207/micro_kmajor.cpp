// The lead of BENCHMARKS.md's "A Xeon with AVX-512 but no bf16 hardware", measured: exact Q4_1
// with output columns in vector lanes, reading blocks stored k-major at load (`repack`), so no
// transpose at run time. Per 32 output columns and block: d[32] and m[32] in fp16, then for each
// of the block's 32 k a 16-byte line of codes (column c's in byte c & 15, low nibble for c < 16,
// high for c >= 16): 640 bytes, the file's 20 a block per column. Weights are fma(q, d, m), the
// bits of the file's dequantized values; rows of x in passes of up to 12, x broadcast. 1 thread.
#include <immintrin.h>
#include <torch/extension.h>

#include <cstring>
#include <type_traits>

namespace {

constexpr int64_t kCols = 32, kBlock = 32, kLine = 16, kPanelBlock = 4 * kCols + kBlock * kLine;
#ifndef KPREFETCH
#define KPREFETCH 4
#endif
constexpr int64_t kPrefetch = KPREFETCH * kPanelBlock;

// The file's blocks (n x nb*20 bytes, n a multiple of 32) -> panels of 32 columns, k-major.
torch::Tensor repack(torch::Tensor blocks) {
    const int64_t n = blocks.size(0), nb = blocks.size(1) / 20;
    TORCH_CHECK(n % kCols == 0, "columns in groups of 32");
    auto out = torch::empty({n / kCols, nb, kPanelBlock}, torch::kUInt8);
    const uint8_t* src = blocks.data_ptr<uint8_t>();
    uint8_t* dst = out.data_ptr<uint8_t>();
    for (int64_t g = 0; g < n / kCols; ++g)
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t* p = dst + (g * nb + b) * kPanelBlock;
            std::memset(p + 4 * kCols, 0, kBlock * kLine);
            for (int64_t c = 0; c < kCols; ++c) {
                const uint8_t* blk = src + (g * kCols + c) * nb * 20 + b * 20;
                std::memcpy(p + 2 * c, blk, 2);                 // d
                std::memcpy(p + 2 * kCols + 2 * c, blk + 2, 2);  // m
                for (int64_t i = 0; i < kBlock; ++i) {
                    const uint8_t byte = blk[4 + (i & 15)];
                    const uint8_t code = i < 16 ? (byte & 15) : (byte >> 4);
                    p[4 * kCols + i * kLine + (c & 15)] |= c < 16 ? code : code << 4;
                }
            }
        }
    return out;
}

template <int R>
void pass(const float* x, int64_t ldx, int64_t nb, const uint8_t* panel, float* out, int64_t ldo) {
    __m512 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const __m512i low4 = _mm512_set1_epi32(15);
    for (int64_t b = 0; b < nb; ++b, panel += kPanelBlock) {
        // The next blocks' lines, kPrefetch bytes ahead: one sequential stream, which the
        // hardware alone ran at 0.84x our kernels' rate over the model's 210 projections.
        for (int64_t line = 0; line < kPanelBlock; line += 64)
            _mm_prefetch(reinterpret_cast<const char*>(panel) + kPrefetch + line, _MM_HINT_T0);
        const auto* h = reinterpret_cast<const __m256i*>(panel);
        const __m512 d0 = _mm512_cvtph_ps(_mm256_loadu_si256(h)),
                     d1 = _mm512_cvtph_ps(_mm256_loadu_si256(h + 1)),
                     m0 = _mm512_cvtph_ps(_mm256_loadu_si256(h + 2)),
                     m1 = _mm512_cvtph_ps(_mm256_loadu_si256(h + 3));
        const uint8_t* codes = panel + 4 * kCols;
        const float* xk = x + b * kBlock;
        for (int64_t i = 0; i < kBlock; ++i) {
            const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(codes + i * kLine)));
            const __m512 w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v, low4)), d0, m0);
            const __m512 w1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), d1, m1);
            for (int r = 0; r < R; ++r) {
                const __m512 xb = _mm512_set1_ps(xk[r * ldx + i]);
                acc[r][0] = _mm512_fmadd_ps(xb, w0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(xb, w1, acc[r][1]);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        _mm512_storeu_ps(out + r * ldo, acc[r][0]);
        _mm512_storeu_ps(out + r * ldo + 16, acc[r][1]);
    }
}

// Every row of x against one group of columns, in passes of R rows, then the rest by fewer.
template <int R, class Pass>
void passes(Pass pass, const float* x, int64_t rows, int64_t k, const uint8_t* panel, int64_t nb,
            float* out, int64_t n) {
    int64_t r = 0;
    for (; r + R <= rows; r += R) pass(std::integral_constant<int, R>{}, x + r * k, panel, out + r * n);
    if constexpr (R > 1)
        if (r < rows) passes<R - 1>(pass, x + r * k, rows - r, k, panel, nb, out + r * n, n);
}

torch::Tensor linear(torch::Tensor x, torch::Tensor panels) {
    const int64_t rows = x.size(0), k = x.size(1), groups = panels.size(0), nb = panels.size(1);
    TORCH_CHECK(nb * kBlock == k, "k and the panels disagree");
    auto out = torch::empty({rows, groups * kCols});
    for (int64_t g = 0; g < groups; ++g)
        passes<12>(
            [&](auto r, const float* xr, const uint8_t* p, float* o) {
                pass<decltype(r)::value>(xr, k, nb, p, o, groups * kCols);
            },
            x.data_ptr<float>(), rows, k, panels.data_ptr<uint8_t>() + g * nb * kPanelBlock, nb,
            out.data_ptr<float>() + g * kCols, groups * kCols);
    return out;
}

// The same over the panels `int8` mode stores already (quant_reference.pack_panels, 16 weight
// rows): per block, the rows' 4-byte code words one word index after another (word g of every
// row in one zmm: bytes t = 0..3 of a lane are elements 4g + t, low nibble, and 4g + t + 16,
// high nibble), then the 16 rows' heads (d and m in fp16). One zmm of 16 columns a k.
constexpr int64_t kPanelRows = 16, kQ41Bytes = 20, kPanelBlock16 = kPanelRows * kQ41Bytes;
constexpr int64_t kPrefetch16 = 2 * KPREFETCH * kPanelBlock16;  // the same bytes ahead as above

template <int R>
void pass16(const float* x, int64_t ldx, int64_t nb, const uint8_t* panel, float* out, int64_t ldo) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    const __m512i low4 = _mm512_set1_epi32(15);
    for (int64_t b = 0; b < nb; ++b, panel += kPanelBlock16) {
        for (int64_t line = 0; line < kPanelBlock16; line += 64)
            _mm_prefetch(reinterpret_cast<const char*>(panel) + kPrefetch16 + line, _MM_HINT_T0);
        const __m512i heads = _mm512_loadu_si512(panel + 4 * 64);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(heads));
        const __m512 m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(heads, 16)));
        const float* xk = x + b * kBlock;
        for (int64_t g = 0; g < 4; ++g) {
            const __m512i v = _mm512_loadu_si512(panel + g * 64);
#pragma GCC unroll 8
            for (int t = 0; t < 8; ++t) {  // unrolled: each shift an immediate; t < 4: low nibbles, k = 4g + t; else k = 4g + t + 12
                const __m512i q = _mm512_and_si512(_mm512_srli_epi32(v, 8 * (t & 3) + 4 * (t >> 2)), low4);
                const __m512 w = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), d, m);
                const int64_t k = 4 * g + (t & 3) + 16 * (t >> 2);
                for (int r = 0; r < R; ++r)
                    acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(xk[r * ldx + k]), w, acc[r]);
            }
        }
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * ldo, acc[r]);
}

torch::Tensor linear_panels(torch::Tensor x, torch::Tensor panels) {
    const int64_t rows = x.size(0), k = x.size(1), n = panels.size(0), nb = k / kBlock;
    TORCH_CHECK(n % kPanelRows == 0 && panels.size(1) == nb * kQ41Bytes, "Q4_1 panels of 16 rows");
    auto out = torch::empty({rows, n});
    for (int64_t p = 0; p < n / kPanelRows; ++p)
        passes<12>(
            [&](auto r, const float* xr, const uint8_t* pp, float* o) {
                pass16<decltype(r)::value>(xr, k, nb, pp, o, n);
            },
            x.data_ptr<float>(), rows, k, panels.data_ptr<uint8_t>() + p * nb * kPanelBlock16, nb,
            out.data_ptr<float>() + p * kPanelRows, n);
    return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("repack", &repack);
    m.def("linear", &linear);
    m.def("linear_panels", &linear_panels);
}
