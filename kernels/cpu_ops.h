// Our C++ CPU kernels: declarations shared by the kernel sources and the Python bindings.
//
// Float32 only; every function checks its inputs with TORCH_CHECK, which reaches Python as a
// RuntimeError naming the bad argument. Work is split on torch's own OpenMP pool
// (at::parallel_for), so the kernels share its threads instead of starting a second runtime.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace paternoster {

// cpu_paged_attention.cpp
void paged_decode_attention(at::Tensor out, const at::Tensor& q, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& block_tables,
                            const at::Tensor& seq_lens, double scale);
// cpu_prefill_attention.cpp: false where this build has no AVX-512 or the head size is not a
// multiple of 16 (the caller keeps SDPA)
bool paged_prefill_attention(at::Tensor out, const at::Tensor& q, const at::Tensor& k_cache,
                             const at::Tensor& v_cache, const at::Tensor& block_tables,
                             const at::Tensor& seq_lens, const at::Tensor& query_start_loc,
                             double scale);
// cpu_prefill_bf16.cpp: a bf16 cache with bf16 products (q and probabilities rounded to bf16):
// AMX tiles where `tiles` and the build and CPU have them (heads of 64 and 128), else AVX-512
// BF16 dot products (heads a multiple of 32); false where neither runs (the caller keeps the
// float32 kernel or SDPA)
bool paged_prefill_attention_bf16(at::Tensor out, const at::Tensor& q, const at::Tensor& k_cache,
                                  const at::Tensor& v_cache, const at::Tensor& block_tables,
                                  const at::Tensor& seq_lens, const at::Tensor& query_start_loc,
                                  double scale, bool tiles);
void write_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor k_cache,
              at::Tensor v_cache, const at::Tensor& slot_mapping);

// cpu_layer_ops.cpp
void rotary_(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor silu_and_mul(const at::Tensor& gate_up);
void add_rms_norm_(at::Tensor x, at::Tensor residual, const at::Tensor& weight, double eps);

// cpu_linear.cpp
at::Tensor skinny_linear(const at::Tensor& x, const at::Tensor& weight,
                         const c10::optional<at::Tensor>& bias);

// cpu_quant_linear.cpp: weight-only quantized linears (layouts in kernels/quant_reference.py).
at::Tensor gguf_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t format,
                       const c10::optional<at::Tensor>& bias);
at::Tensor gguf_dequantize(const at::Tensor& blocks, int64_t format, bool bf16,
                           int64_t panel_rows);
std::string quant_isa();  // "avx512" or "avx2": the vector paths this build compiled

// cpu_gguf_q8.cpp: gguf_linear with x rounded to 8 bits a block (integer dot products); blocks
// stored as panels (kernels/quant_reference.py `pack_panels`) where `panels`.
at::Tensor gguf_linear_q8(const at::Tensor& x, const at::Tensor& blocks, int64_t format,
                          const c10::optional<at::Tensor>& bias, bool panels);
namespace quant {
int64_t q8_panel_rows();  // cpu_quant.h
}  // namespace quant
// cpu_gguf_kmajor.cpp: the exact gguf_linear over GGUF blocks stored k-major
// (kernels/quant_reference.py `pack_kmajor`), their dequantizing and rows; AVX2 and AVX-512.
bool gguf_kmajor_supported(int64_t format);
at::Tensor gguf_linear_kmajor(const at::Tensor& x, const at::Tensor& blocks, int64_t format,
                              const c10::optional<at::Tensor>& bias);
at::Tensor gguf_dequantize_kmajor(const at::Tensor& blocks, int64_t format);
at::Tensor gguf_kmajor_rows(const at::Tensor& blocks, int64_t format, const at::Tensor& index);
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                       const c10::optional<at::Tensor>& bias);

// cpu_decode_stack.cpp: every layer of an all-decode step in one call (the Python layers'
// kernels in their order). Built once per model by worker/models/decode_stack.py: per layer its
// four projections (add_linear: qkv, o, gate_up, down), then its two norms (add_layer).
class DecodeStack {
   public:
    static constexpr int64_t kFloat32 = 0;  // skinny_linear up to skinny_rows, else oneDNN
    static constexpr int64_t kGguf = 1;     // gguf_linear(_q8 up to skinny_rows) on GGUF blocks
    static constexpr int64_t kInt8 = 2;     // int8_linear on an int8 weight and its scale
    static constexpr int64_t kGgufPanels = 3;  // gguf_linear_q8 on GGUF blocks stored as panels
    static constexpr int64_t kGgufKmajor = 4;  // gguf_linear_kmajor on blocks stored k-major

    DecodeStack(int64_t num_q_heads, int64_t num_kv_heads, int64_t head_size, double eps,
                double scale, at::Tensor final_norm);
    void add_linear(int64_t kind, c10::optional<at::Tensor> weight,
                    c10::optional<at::Tensor> scale, int64_t format,
                    c10::optional<at::Tensor> bias, c10::optional<at::Tensor> packed,
                    int64_t skinny_rows);
    void add_layer(at::Tensor input_norm, at::Tensor post_norm, c10::optional<at::Tensor> q_norm,
                   c10::optional<at::Tensor> k_norm);
    void set_caches(std::vector<at::Tensor> k_caches, std::vector<at::Tensor> v_caches);
    at::Tensor forward(at::Tensor hidden, const at::Tensor& cos, const at::Tensor& sin,
                       const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                       const at::Tensor& seq_lens) const;

   private:
    struct Linear {
        int64_t kind;
        at::Tensor weight;
        at::Tensor scale;  // kInt8 only
        int64_t format;    // kGguf only
        c10::optional<at::Tensor> bias;
        at::Tensor packed;    // kFloat32: oneDNN's packed weight
        int64_t skinny_rows;  // kFloat32: rows up to which the plain weight (if any) is used;
                              // kGguf: rows up to which x is rounded to 8 bits
        at::Tensor operator()(const at::Tensor& x) const;
    };
    int64_t num_q_heads_, num_kv_heads_, head_size_;
    double eps_, scale_;
    at::Tensor final_norm_;
    std::vector<Linear> linears_;                            // 4 a layer
    std::vector<std::pair<at::Tensor, at::Tensor>> norms_;  // (input, post-attention) a layer
    std::vector<std::pair<at::Tensor, at::Tensor>> q_norms_;  // (q, k) a layer: Qwen3
    std::vector<at::Tensor> k_caches_, v_caches_;
};

// The checks every kernel makes of its arguments, with the argument's name in the message.
inline void check(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t dim) {
    TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
    TORCH_CHECK(t.scalar_type() == dtype, name, " has dtype ", t.scalar_type(), ", expected ",
                dtype);
    TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dimensions, has ", t.dim());
}

// Float32 (rows, heads, head_size) whose rows may be strided (views into the fused qkv
// projection) but whose heads and elements within a row must not be.
inline void check_rows(const at::Tensor& t, const char* name) {
    check(t, name, at::kFloat, 3);
    TORCH_CHECK(t.stride(2) == 1 && t.stride(1) == t.size(2),
                name, " must have contiguous heads within each row");
}

// A K/V cache pair: float32 or bf16, both the same, contiguous, of one shape (the attention
// kernels' layout, cpu_paged_attention.cpp's header).
inline void check_cache(const at::Tensor& k_cache, const at::Tensor& v_cache) {
    const at::ScalarType dtype = k_cache.scalar_type();
    TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
                "k_cache has dtype ", dtype, ", expected Float or BFloat16");
    check(k_cache, "k_cache", dtype, 4);
    check(v_cache, "v_cache", dtype, 4);
    TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
    TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "k_cache and v_cache differ in shape");
}

// The block ids a sequence of `ctx` tokens reads from its table row: a bad table would read
// outside the cache (32 sequences x 32 blocks is ~1 us against ~1 ms of attention per layer).
inline void check_block_ids(const int32_t* table, int64_t ctx, int64_t block_size,
                            int64_t num_blocks) {
    for (int64_t i = 0; i < (ctx + block_size - 1) / block_size; ++i)
        TORCH_CHECK(table[i] >= 0 && table[i] < num_blocks, "block id ", table[i], " out of range");
}

// A cache element as float32: bf16 is float32's upper half, so widening is a 16-bit shift, which
// `#pragma omp simd` loops vectorise (a zero-extending load and a shift per 16 values).
inline float widen(float x) { return x; }
inline float widen(uint16_t x) { return __builtin_bit_cast(float, static_cast<uint32_t>(x) << 16); }

// exp(x) for float, written so that `#pragma omp simd` loops vectorise it (std::exp does not
// without -ffast-math, which would also loosen the rest of the code). Cephes' expf: x = n ln2 + r
// with |r| <= ln2/2, a degree-6 polynomial for exp(r), 2^n built in the exponent bits. Relative
// error under 2e-7 on [-87, 88]; inputs below -87 give ~1.6e-38 rather than 0, which no softmax
// or SiLU here can tell from 0.
#pragma omp declare simd notinbranch
inline float vexp(float x) {
    x = x < -87.0f ? -87.0f : x;  // not fmin/fmax: their NaN rules block vectorising
    x = x > 88.0f ? 88.0f : x;
    // n = round(x / ln2) by the 1.5 * 2^23 trick: floorf does not vectorise without
    // -fno-trapping-math, and |x / ln2| < 128 is far inside the trick's 2^22 range.
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
    return p * __builtin_bit_cast(float, bits);
}

}  // namespace paternoster
