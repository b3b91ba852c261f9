// Two fp32 microkernels over a weight already in fp32, 1 thread: the dot-product tile of
// cpu_gguf_tile.h (4 weight rows x 6 rows of x, horizontal sums) and a broadcast one
// (32 output columns in two zmm x R rows of x, weights k-major). Same arithmetic count.
#include <torch/extension.h>
#include <immintrin.h>

static inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

// out[r][o] = sum_k x[r][k] w[o][k]; w row-major (n, k)
template <int R, int O>
static void dot_tile(const float* x, int64_t k, const float* w, float* out, int64_t n) {
    __m512 acc[R][O];
    for (int r = 0; r < R; ++r) for (int o = 0; o < O; ++o) acc[r][o] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += 16) {
        __m512 wv[O];
        for (int o = 0; o < O; ++o) wv[o] = _mm512_loadu_ps(w + o * k + i);
        for (int r = 0; r < R; ++r) {
            __m512 xv = _mm512_loadu_ps(x + r * k + i);
            __asm__("" : "+v"(xv));
            for (int o = 0; o < O; ++o) acc[r][o] = _mm512_fmadd_ps(xv, wv[o], acc[r][o]);
        }
    }
    for (int r = 0; r < R; ++r) for (int o = 0; o < O; ++o) out[r * n + o] = hsum(acc[r][o]);
}

torch::Tensor dot(torch::Tensor x, torch::Tensor w) {  // x (12|6k rows, k), w (n, k)
    const int64_t rows = x.size(0), k = x.size(1), n = w.size(0);
    auto out = torch::empty({rows, n});
    const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
    float* op = out.data_ptr<float>();
    for (int64_t o = 0; o < n; o += 4)
        for (int64_t r = 0; r < rows; r += 6) dot_tile<6, 4>(xp + r * k, k, wp + o * k, op + r * n + o, n);
    return out;
}

// w k-major in panels of 32 columns: wp[(o/32)][k][32]
template <int R>
static void bc_tile(const float* x, int64_t k, const float* w, float* out, int64_t n) {
    __m512 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; ++i) {
        const __m512 w0 = _mm512_loadu_ps(w + i * 32), w1 = _mm512_loadu_ps(w + i * 32 + 16);
        for (int r = 0; r < R; ++r) {
            const __m512 xb = _mm512_set1_ps(x[r * k + i]);
            acc[r][0] = _mm512_fmadd_ps(xb, w0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(xb, w1, acc[r][1]);
        }
    }
    for (int r = 0; r < R; ++r) {
        _mm512_storeu_ps(out + r * n, acc[r][0]);
        _mm512_storeu_ps(out + r * n + 16, acc[r][1]);
    }
}

torch::Tensor bc(torch::Tensor x, torch::Tensor wp) {  // wp (n/32, k, 32)
    const int64_t rows = x.size(0), k = x.size(1), n = wp.size(0) * 32;
    auto out = torch::empty({rows, n});
    const float *xp = x.data_ptr<float>(), *w = wp.data_ptr<float>();
    float* op = out.data_ptr<float>();
    for (int64_t p = 0; p < n / 32; ++p)
        for (int64_t r = 0; r < rows; r += 12) bc_tile<12>(xp + r * k, k, w + p * k * 32, op + r * n + p * 32, n);
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("dot", &dot);
    m.def("bc", &bc);
}
