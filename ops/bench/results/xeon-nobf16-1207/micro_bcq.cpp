// Exact Q4_1 linear from the file's layout, output columns in lanes: per 32 weight rows, every
// block dequantized (cpu_gguf_dequant.h) and transposed into a k-major panel (k x 32 floats),
// then rows of x in passes of up to 12 against it, x broadcast. 1 thread.
#include <torch/extension.h>
#include <vector>
#include "cpu_gguf_dequant.h"

using namespace paternoster::quant;

static inline void transpose16(__m512 (&r)[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        u[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int c = 0; c < 4; ++c) {
        const __m512 s0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
        const __m512 s1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
        const __m512 s2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
        const __m512 s3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
        r[c] = _mm512_shuffle_f32x4(s0, s2, 0x88);
        r[4 + c] = _mm512_shuffle_f32x4(s0, s2, 0xDD);
        r[8 + c] = _mm512_shuffle_f32x4(s1, s3, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(s1, s3, 0xDD);
    }
}

// 32 weight rows (ldw bytes apart) of nb Q4_1 blocks -> panel[k][32]
static void fill_panel(const uint8_t* w, int64_t ldw, int64_t nb, float* panel) {
    alignas(64) float buf[32][32];
    for (int64_t b = 0; b < nb; ++b) {
        for (int o = 0; o < 32; ++o) {
            f16v lo, hi;
            dequant<kQ4_1>(w + o * ldw + b * 20, lo, hi);
            _mm512_store_ps(buf[o], __m512(lo));
            _mm512_store_ps(buf[o] + 16, __m512(hi));
        }
        float* dst = panel + b * 32 * 32;
        for (int g = 0; g < 2; ++g)      // weight rows 16 g ..
            for (int h = 0; h < 2; ++h) {  // k half
                __m512 r[16];
                for (int i = 0; i < 16; ++i) r[i] = _mm512_load_ps(buf[16 * g + i] + 16 * h);
                transpose16(r);
                for (int j = 0; j < 16; ++j) _mm512_storeu_ps(dst + (16 * h + j) * 32 + 16 * g, r[j]);
            }
    }
}

template <int R>
static void bc_tile(const float* x, int64_t ldx, int64_t k, const float* w, float* out, int64_t ldo) {
    __m512 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; ++i) {
        const __m512 w0 = _mm512_loadu_ps(w + i * 32), w1 = _mm512_loadu_ps(w + i * 32 + 16);
        for (int r = 0; r < R; ++r) {
            const __m512 xb = _mm512_set1_ps(x[r * ldx + i]);
            acc[r][0] = _mm512_fmadd_ps(xb, w0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(xb, w1, acc[r][1]);
        }
    }
    for (int r = 0; r < R; ++r) {
        _mm512_storeu_ps(out + r * ldo, acc[r][0]);
        _mm512_storeu_ps(out + r * ldo + 16, acc[r][1]);
    }
}

torch::Tensor bcq(torch::Tensor x, torch::Tensor blocks) {
    const int64_t rows = x.size(0), k = x.size(1), n = blocks.size(0), nb = k / 32;
    const int64_t ldw = blocks.size(1);
    auto out = torch::empty({rows, n});
    const float* xp = x.data_ptr<float>();
    const uint8_t* wp = blocks.data_ptr<uint8_t>();
    float* op = out.data_ptr<float>();
    thread_local std::vector<float> panel;
    panel.resize(k * 32);
    for (int64_t o = 0; o < n; o += 32) {
        fill_panel(wp + o * ldw, ldw, nb, panel.data());
        in_passes<12>(rows, [&](int64_t r, auto m) {
            bc_tile<decltype(m)::value>(xp + r * k, k, k, panel.data(), op + r * n + o, n);
        });
    }
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("bcq", &bcq); }
