// Paged decode attention for CPU: one query token per sequence, read straight from the paged
// KV cache. The pure-torch path (kernels/reference.py) gathers every sequence's blocks into a
// padded copy before two batched matmuls; this reads each K and V row once, where it lies.
//
// Layout, as in the rest of the project:
//   q, out          (num_seqs, num_q_heads, head_size)            float32, contiguous
//   k_cache, v_cache (num_blocks, num_kv_heads, block_size, head_size) float32, contiguous
//   block_tables    (num_seqs, max_blocks_per_seq)                 int32
//   seq_lens        (num_seqs,)                                    int32, tokens in context
// Query heads are grouped over KV heads (GQA): query head h reads KV head h / group.
//
// Work is split over (sequence, KV head) pairs on torch's own thread pool (at::parallel_for), so
// it shares torch's OpenMP threads instead of starting a second runtime beside them.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
    float acc = 0.f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
    return acc;
}

inline void axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// One (sequence, KV head) pair: all `group` query heads that read this KV head.
void attend_one(const float* q, const float* k_cache, const float* v_cache, const int32_t* table,
                int64_t ctx, int64_t group, int64_t kv_head, int64_t num_kv_heads,
                int64_t block_size, int64_t head_size, float scale, float* out,
                std::vector<float>& scores) {
    const int64_t block_stride = num_kv_heads * block_size * head_size;
    const int64_t head_offset = kv_head * block_size * head_size;
    scores.assign(static_cast<size_t>(group * ctx), 0.f);
    // Pass 1: scores, block by block, so each K row is loaded once for the whole group.
    for (int64_t t0 = 0; t0 < ctx; t0 += block_size) {
        const float* k_block = k_cache + table[t0 / block_size] * block_stride + head_offset;
        const int64_t n = std::min(block_size, ctx - t0);
        for (int64_t s = 0; s < n; ++s) {
            const float* k_row = k_block + s * head_size;
            for (int64_t g = 0; g < group; ++g)
                scores[g * ctx + t0 + s] = dot(q + g * head_size, k_row, head_size) * scale;
        }
    }
    // Softmax per query head, in place; exp of (score - max) keeps it finite.
    for (int64_t g = 0; g < group; ++g) {
        float* row = scores.data() + g * ctx;
        float max_score = -std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t < ctx; ++t) max_score = std::max(max_score, row[t]);
        float total = 0.f;
        for (int64_t t = 0; t < ctx; ++t) {
            row[t] = std::exp(row[t] - max_score);
            total += row[t];
        }
        const float inv = 1.f / total;
        for (int64_t t = 0; t < ctx; ++t) row[t] *= inv;
    }
    // Pass 2: weighted sum of V rows, again one load per row for the whole group.
    std::fill(out, out + group * head_size, 0.f);
    for (int64_t t0 = 0; t0 < ctx; t0 += block_size) {
        const float* v_block = v_cache + table[t0 / block_size] * block_stride + head_offset;
        const int64_t n = std::min(block_size, ctx - t0);
        for (int64_t s = 0; s < n; ++s) {
            const float* v_row = v_block + s * head_size;
            for (int64_t g = 0; g < group; ++g)
                axpy(scores[g * ctx + t0 + s], v_row, out + g * head_size, head_size);
        }
    }
}

void check(const torch::Tensor& t, const char* name, at::ScalarType dtype, int64_t dim) {
    TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
    TORCH_CHECK(t.scalar_type() == dtype, name, " has dtype ", t.scalar_type());
    TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dimensions, has ", t.dim());
    TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

}  // namespace

void paged_decode_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache,
                            torch::Tensor v_cache, torch::Tensor block_tables,
                            torch::Tensor seq_lens, double scale) {
    check(out, "out", at::kFloat, 3);
    check(q, "q", at::kFloat, 3);
    check(k_cache, "k_cache", at::kFloat, 4);
    check(v_cache, "v_cache", at::kFloat, 4);
    check(block_tables, "block_tables", at::kInt, 2);
    check(seq_lens, "seq_lens", at::kInt, 1);
    TORCH_CHECK(out.sizes() == q.sizes(), "out and q differ in shape");
    TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "k_cache and v_cache differ in shape");
    const int64_t num_seqs = q.size(0), num_q_heads = q.size(1), head_size = q.size(2);
    const int64_t num_kv_heads = k_cache.size(1), block_size = k_cache.size(2);
    TORCH_CHECK(k_cache.size(3) == head_size, "head_size differs between q and the cache");
    TORCH_CHECK(num_q_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads");
    TORCH_CHECK(block_tables.size(0) >= num_seqs && seq_lens.size(0) >= num_seqs,
                "fewer block tables or lengths than sequences");
    const int64_t group = num_q_heads / num_kv_heads;
    const int64_t max_blocks = block_tables.size(1);
    const int64_t num_blocks = k_cache.size(0);
    const int32_t* tables = block_tables.data_ptr<int32_t>();
    const int32_t* lens = seq_lens.data_ptr<int32_t>();
    for (int64_t b = 0; b < num_seqs; ++b) {
        const int64_t ctx = lens[b];
        TORCH_CHECK(ctx >= 1 && ctx <= max_blocks * block_size, "sequence ", b, " has length ",
                    ctx, " outside its block table");
        for (int64_t i = 0; i < (ctx + block_size - 1) / block_size; ++i) {
            const int32_t block = tables[b * max_blocks + i];
            TORCH_CHECK(block >= 0 && block < num_blocks, "block id ", block, " out of range");
        }
    }
    const float* q_ptr = q.data_ptr<float>();
    const float* k_ptr = k_cache.data_ptr<float>();
    const float* v_ptr = v_cache.data_ptr<float>();
    float* out_ptr = out.data_ptr<float>();
    const float scale_f = static_cast<float>(scale);
    at::parallel_for(0, num_seqs * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> scores;
        for (int64_t i = begin; i < end; ++i) {
            const int64_t b = i / num_kv_heads, h = i % num_kv_heads;
            const int64_t offset = (b * num_q_heads + h * group) * head_size;
            attend_one(q_ptr + offset, k_ptr, v_ptr, tables + b * max_blocks, lens[b], group, h,
                       num_kv_heads, block_size, head_size, scale_f, out_ptr + offset, scores);
        }
    });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("paged_decode_attention", &paged_decode_attention,
          "Paged decode attention into out (float32, CPU)");
}
