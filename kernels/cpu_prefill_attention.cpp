// Paged prefill attention for CPU: each chunk's queries against its context, causal, read from
// the blocks where they lie, with an online softmax (flash attention's order of work).
//
// Why: the `cpu` backend ran prefill chunks through torch's SDPA (kernels/reference.py), whose
// flash kernel multiplies its tiles with the BLAS torch links, MKL; on AMD CPUs MKL's sgemm runs
// without AVX-512. On a 2-core Zen 5 a 512-token chunk over 1,536 tokens of context took
// 12.4 ms a layer there (about 120 GFLOP/s; 15.5 in bf16), and the 64-request mix spent
// 6.8-7.6 s of a 26-34 s run in prefill attention. Here both products are register-blocked FMA
// loops (cpu_prefill_vec.h): K is first transposed per (sequence, KV head) into float32 panels,
// V is read in place. The same chunk: 6.6 ms (ops/bench/prefill_attention.py; BENCHMARKS.md).
// Queries of the G heads over one KV head share its K panel and V rows: a task is a sequence,
// a KV head and a tile of `kTileTokens` tokens (G x tokens rows), costliest first.
//
// Layout as in cpu_paged_attention.cpp: a float32 or bf16 cache (bf16 widened to float32 as it
// is read, so all arithmetic is float32), head_size a multiple of 16. AVX-512 builds only
// (cpu_prefill_vec.h says why): elsewhere the call returns false and the caller keeps SDPA.
// query_start_loc (num_seqs + 1,) int32 gives each sequence's queries, the last of its context.

#include "cpu_ops.h"
#include "cpu_prefill_tasks.h"
#include "cpu_prefill_vec.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace paternoster {
namespace {

#ifdef PATERNOSTER_PREFILL_VEC
using namespace prefill_vec;

constexpr int64_t kTileTokens = 32;  // query tokens per task (96 rows at SmolLM2's G = 3)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One sequence's context as K panels: per KV head, head_size rows of `stride` keys (the
// context rounded up to whole chunks, zeros past it).
struct Panels {
    int64_t offset;  // into the step's panel buffer
    int64_t stride;
};

template <typename T>
struct Args {
    const float* q;
    int64_t q_stride;
    float* out;
    int64_t out_stride;
    const T* v_cache;
    const int32_t* tables;
    int64_t table_stride;
    const int32_t* lens;
    const int32_t* starts;
    int64_t num_kv_heads, group, block_size, hs;
    float scale;
    const float* panels;
    const Panels* panel_of;
};

// One task: its rows' scores chunk by chunk, the softmax running, the output rescaled.
template <typename T>
void attend_tile(const Args<T>& a, const PrefillTask& t, std::vector<float>& work) {
    const int64_t rows = t.tokens * a.group;
    const int64_t ctx = a.lens[t.seq];
    const int64_t q_len = a.starts[t.seq + 1] - a.starts[t.seq];
    const int64_t first_pos = ctx - q_len + t.first;  // position of the tile's first token
    work.assign(rows * (kKeys + a.hs + 2), 0.f);
    float* s = work.data();                 // rows x kKeys: scores, then probabilities
    float* o = s + rows * kKeys;            // rows x hs: the unnormalised output
    float* m = o + rows * a.hs;             // running max per row
    float* l = m + rows;                    // running sum per row
    std::fill(m, m + rows, kNegInf);
    std::vector<const float*> q(rows);
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t token = a.starts[t.seq] + t.first + r / a.group;
        q[r] = a.q + token * a.q_stride + (t.head * a.group + r % a.group) * a.hs;
    }
    const Panels& panel = a.panel_of[t.seq];
    const float* kt = a.panels + panel.offset + t.head * a.hs * panel.stride;
    const int32_t* table = a.tables + t.seq * a.table_stride;
    const int64_t head_offset = t.head * a.block_size * a.hs;
    const int64_t block_elems = a.num_kv_heads * a.block_size * a.hs;
    const T* v[kKeys];
    for (int64_t kc = 0; kc < t.keys; kc += kKeys) {
        const int64_t n = std::min(kKeys, t.keys - kc);
        for (int64_t r = 0; r < rows; r += kRows) {
            with_rows(std::min<int64_t>(kRows, rows - r), [&](auto R) {
                score_rows<decltype(R)::value>(q.data() + r, kt + kc, panel.stride, a.hs,
                                                s + r * kKeys);
            });
        }
        for (int64_t r = 0; r < rows; ++r) {
            float* sr = s + r * kKeys;
            // Keys a row may see in this chunk: up to its own position.
            const int64_t allowed = std::min(n, first_pos + r / a.group - kc + 1);
            if (allowed <= 0) {
                std::fill(sr, sr + kKeys, 0.f);
                continue;
            }
            float top = kNegInf;
#pragma omp simd reduction(max : top)
            for (int64_t j = 0; j < allowed; ++j) top = top > sr[j] ? top : sr[j];
            top *= a.scale;  // scale > 0: the max of the scaled scores
            const float m_new = std::max(m[r], top);
            const float alpha = m[r] == kNegInf ? 0.f : vexp(m[r] - m_new);
            float total = 0.f;
#pragma omp simd reduction(+ : total)
            for (int64_t j = 0; j < allowed; ++j) {
                const float p = vexp(sr[j] * a.scale - m_new);
                sr[j] = p;
                total += p;
            }
            std::fill(sr + allowed, sr + kKeys, 0.f);
            l[r] = l[r] * alpha + total;
            m[r] = m_new;
            if (alpha != 1.f) {
                float* orow = o + r * a.hs;
#pragma omp simd
                for (int64_t c = 0; c < a.hs; ++c) orow[c] *= alpha;
            }
        }
        for (int64_t j = 0; j < n; ++j) {
            const int64_t key = kc + j;
            v[j] = a.v_cache + table[key / a.block_size] * block_elems + head_offset +
                   (key % a.block_size) * a.hs;
        }
        for (int64_t r = 0; r < rows; r += kRows) {
            with_rows(std::min<int64_t>(kRows, rows - r), [&](auto R) {
                add_values_all<decltype(R)::value>(s + r * kKeys, v, n, a.hs, o + r * a.hs);
            });
        }
    }
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t token = a.starts[t.seq] + t.first + r / a.group;
        float* dst = a.out + token * a.out_stride + (t.head * a.group + r % a.group) * a.hs;
        const float inv = 1.f / l[r];
        const float* orow = o + r * a.hs;
#pragma omp simd
        for (int64_t c = 0; c < a.hs; ++c) dst[c] = orow[c] * inv;
    }
}

// Every (sequence, KV head)'s K as float32 panels, transposed (and widened) from its blocks.
template <typename T>
std::vector<float> build_panels(const T* k, const at::Tensor& k_cache, const int32_t* tables,
                                int64_t table_stride, const int32_t* lens, int64_t num_seqs,
                                int64_t hs, std::vector<Panels>& panel_of) {
    const int64_t num_kv_heads = k_cache.size(1), block_size = k_cache.size(2);
    int64_t total = 0;
    for (int64_t b = 0; b < num_seqs; ++b) {
        const int64_t stride = (lens[b] + kKeys - 1) / kKeys * kKeys;
        panel_of[b] = Panels{total, stride};
        total += num_kv_heads * hs * stride;
    }
    std::vector<float> panels(total, 0.f);
    const int64_t block_elems = num_kv_heads * block_size * hs;
    at::parallel_for(0, num_seqs * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const int64_t b = i / num_kv_heads, h = i % num_kv_heads;
            float* dst = panels.data() + panel_of[b].offset + h * hs * panel_of[b].stride;
            const int64_t stride = panel_of[b].stride;
            for (int64_t key = 0; key < lens[b]; ++key) {
                const T* src = k + tables[b * table_stride + key / block_size] * block_elems +
                               (h * block_size + key % block_size) * hs;
                for (int64_t d = 0; d < hs; ++d) dst[d * stride + key] = widen(src[d]);
            }
        }
    });
    return panels;
}
#endif  // PATERNOSTER_PREFILL_VEC

}  // namespace

bool paged_prefill_attention(at::Tensor out, const at::Tensor& q, const at::Tensor& k_cache,
                             const at::Tensor& v_cache, const at::Tensor& block_tables,
                             const at::Tensor& seq_lens, const at::Tensor& query_start_loc,
                             double scale) {
    check_prefill_args(out, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale);
#ifdef PATERNOSTER_PREFILL_VEC
    const int64_t num_seqs = seq_lens.size(0), hs = q.size(2);
    const int64_t num_kv_heads = k_cache.size(1);
    if (hs % kLanes != 0) return false;
    const int32_t* lens = seq_lens.data_ptr<int32_t>();
    const int32_t* starts = query_start_loc.data_ptr<int32_t>();
    const int32_t* tables = block_tables.data_ptr<int32_t>();
    const int64_t table_stride = block_tables.stride(0), block_size = k_cache.size(2);
    const std::vector<PrefillTask> tasks =
        prefill_tasks(seq_lens, query_start_loc, num_kv_heads, kTileTokens);
    if (tasks.empty()) return true;
    std::vector<Panels> panel_of(num_seqs);
    auto run = [&](const auto* k, const auto* v) {
        using T = std::remove_const_t<std::remove_pointer_t<decltype(k)>>;
        const std::vector<float> panels =
            build_panels(k, k_cache, tables, table_stride, lens, num_seqs, hs, panel_of);
        const Args<T> args{q.data_ptr<float>(), q.stride(0), out.data_ptr<float>(),
                           out.stride(0), v, tables, table_stride, lens, starts, num_kv_heads,
                           q.size(1) / num_kv_heads, block_size, hs, static_cast<float>(scale),
                           panels.data(), panel_of.data()};
        run_tasks(
            tasks, [] { return std::vector<float>(); },
            [&](const PrefillTask& t, std::vector<float>& work) { attend_tile(args, t, work); });
    };
    if (k_cache.scalar_type() == at::kFloat)
        run(k_cache.data_ptr<float>(), v_cache.data_ptr<float>());
    else  // bf16 as its bits: widened to float32 as they are read
        run(static_cast<const uint16_t*>(k_cache.data_ptr()),
            static_cast<const uint16_t*>(v_cache.data_ptr()));
    return true;
#else
    return false;  // no AVX-512 in this build: the caller keeps SDPA
#endif
}

}  // namespace paternoster
