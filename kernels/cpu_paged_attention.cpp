// Paged decode attention and the K/V cache write for CPU, read and written where the blocks lie.
// The pure-torch path (kernels/reference.py) gathers every sequence's blocks into a padded copy
// before two batched matmuls, and writes the cache through two advanced-index assignments.
//
// Layout, as in the rest of the project:
//   q, out            (num_seqs, num_q_heads, head_size)  float32; rows may be strided (q is a
//                     view into the fused qkv projection), heads and elements are contiguous
//   key, value        (num_tokens, num_kv_heads, head_size), rows may be strided likewise
//   k_cache, v_cache  (num_blocks, num_kv_heads, block_size, head_size) float32 or bfloat16
//                     (`--kv-cache-dtype`), both the same, contiguous; bf16 rows are widened to
//                     float32 as they are read, so all arithmetic is float32 either way
//   block_tables      (num_seqs, max_blocks_per_seq) int32
//   seq_lens          (num_seqs,) int32, tokens in context;  slot_mapping (num_tokens,) int64
// Query heads are grouped over KV heads (GQA): query head h reads KV head h / group.

#include "cpu_attention_vec.h"
#include "cpu_ops.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace paternoster {
namespace {

// G query heads (contiguous, n floats apart) against one K row: G independent FMA chains, so the
// adds of one head do not wait on the previous one's (a single chain left the kernel at 9 GB/s of
// K/V on a 25 GB/s machine).
template <int G, typename T>
inline void dots(const float* q, const T* k, int64_t n, float scale, float* res,
                 int64_t res_stride) {
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
    for (int64_t i = 0; i < n; ++i) {
        const float x = widen(k[i]);
        a0 += q[i] * x;
        if constexpr (G > 1) a1 += q[n + i] * x;
        if constexpr (G > 2) a2 += q[2 * n + i] * x;
        if constexpr (G > 3) a3 += q[3 * n + i] * x;
    }
    res[0] = a0 * scale;
    if constexpr (G > 1) res[res_stride] = a1 * scale;
    if constexpr (G > 2) res[2 * res_stride] = a2 * scale;
    if constexpr (G > 3) res[3 * res_stride] = a3 * scale;
}

// out[g] += p[g * p_stride] * v for G heads: one load of each V element serves all G.
template <int G, typename T>
inline void axpys(const float* p, int64_t p_stride, const T* v, float* out, int64_t n) {
    const float p0 = p[0];
    const float p1 = G > 1 ? p[p_stride] : 0.f;
    const float p2 = G > 2 ? p[2 * p_stride] : 0.f;
    const float p3 = G > 3 ? p[3 * p_stride] : 0.f;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
        const float x = widen(v[i]);
        out[i] += p0 * x;
        if constexpr (G > 1) out[n + i] += p1 * x;
        if constexpr (G > 2) out[2 * n + i] += p2 * x;
        if constexpr (G > 3) out[3 * n + i] += p3 * x;
    }
}

// dots<G> over all `group` heads, in chunks of at most 4 (SmolLM2 has 3 per KV head).
template <typename T>
inline void group_dots(const float* q, const T* k, int64_t group, int64_t n, float scale,
                       float* res, int64_t res_stride) {
    int64_t g = 0;
    for (; g + 4 <= group; g += 4)
        dots<4, T>(q + g * n, k, n, scale, res + g * res_stride, res_stride);
    const float* qg = q + g * n;
    float* rg = res + g * res_stride;
    switch (group - g) {
        case 3: dots<3, T>(qg, k, n, scale, rg, res_stride); break;
        case 2: dots<2, T>(qg, k, n, scale, rg, res_stride); break;
        case 1: dots<1, T>(qg, k, n, scale, rg, res_stride); break;
        default: break;
    }
}

// axpys<G> over all `group` heads, in chunks of at most 4.
template <typename T>
inline void group_axpys(const float* p, int64_t p_stride, const T* v, float* out,
                        int64_t group, int64_t n) {
    int64_t g = 0;
    for (; g + 4 <= group; g += 4) axpys<4, T>(p + g * p_stride, p_stride, v, out + g * n, n);
    const float* pg = p + g * p_stride;
    float* og = out + g * n;
    switch (group - g) {
        case 3: axpys<3, T>(pg, p_stride, v, og, n); break;
        case 2: axpys<2, T>(pg, p_stride, v, og, n); break;
        case 1: axpys<1, T>(pg, p_stride, v, og, n); break;
        default: break;
    }
}

#ifdef PATERNOSTER_ATTENTION_VEC
// f(g, G) for each chunk of at most 4 of `group` heads, starting at head g, with G (a
// std::integral_constant) its head count as a compile-time constant.
template <typename F>
inline void head_chunks(int64_t group, F&& f) {
    for (int64_t g = 0; g < group; g += 4) {
        switch (std::min<int64_t>(4, group - g)) {
            case 4: f(g, std::integral_constant<int, 4>{}); break;
            case 3: f(g, std::integral_constant<int, 3>{}); break;
            case 2: f(g, std::integral_constant<int, 2>{}); break;
            default: f(g, std::integral_constant<int, 1>{}); break;
        }
    }
}
#endif

// group_dots over a block's n rows (hs apart): the explicit vectors of cpu_attention_vec.h where
// the head is a whole number of them, in chunks of at most 4 heads, else row by row.
template <typename T>
inline void block_group_dots(const float* q, const T* k, int64_t n, int64_t group, int64_t hs,
                             float scale, float* res, int64_t res_stride) {
#ifdef PATERNOSTER_ATTENTION_VEC
    if (hs % attention_vec::kLanes == 0) {
        head_chunks(group, [&](int64_t g, auto heads) {
            attention_vec::block_dots<decltype(heads)::value>(q + g * hs, k, n, hs, scale,
                                                              res + g * res_stride, res_stride);
        });
        return;
    }
#endif
    for (int64_t s = 0; s < n; ++s) group_dots(q, k + s * hs, group, hs, scale, res + s, res_stride);
}

// group_axpys over a block's n rows, dispatched as block_group_dots is.
template <typename T>
inline void block_group_axpys(const float* p, int64_t p_stride, const T* v, int64_t n,
                              int64_t group, int64_t hs, float* out) {
#ifdef PATERNOSTER_ATTENTION_VEC
    if (hs % attention_vec::kLanes == 0) {
        head_chunks(group, [&](int64_t g, auto heads) {
            attention_vec::block_axpys<decltype(heads)::value>(p + g * p_stride, p_stride, v, n,
                                                               hs, out + g * hs);
        });
        return;
    }
#endif
    for (int64_t s = 0; s < n; ++s) group_axpys(p + s, p_stride, v + s * hs, out, group, hs);
}

// Asks for a block's rows of one head (4 KB at 16 x 64 floats, 2 KB in bf16) ahead of use.
// Blocks lie anywhere in the cache, and hardware prefetchers stop at page boundaries, so without
// this every block starts with a full DRAM miss: the kernel read K/V at 9 GB/s on a machine that
// streams 18. Into L2, not L1 (locality 2, prefetcht1): a block's 64 lines asked for at once
// into L1 fill its miss buffers. On a Zen 4 EPYC, 30 layers' caches on huge pages with scattered
// blocks, GB/s of K/V over two runs, L1 / L2 / no prefetch: 7.3-8.1 / 10.3-12.1 / 7.9-8.4 at 1
// thread, 12.8-16.1 / 17.7-21.4 / 15.4-16.8 at 2 (14 x 400, 8 x 1,000 and 40 x 300 tokens;
// 2026-12-08, ops/bench/results/prof-1208/attention_bandwidth.txt); that CPU reads sequentially
// at 29 GB/s on 1 thread. On an AMX Xeon the two hints were within 3% of each other
// (2026-12-06, huge-pages-1206/experiments.txt). The arithmetic is the same either way.
template <typename T>
inline void prefetch_rows(const T* rows, int64_t num_values) {
    for (int64_t i = 0; i < num_values; i += 64 / sizeof(T)) __builtin_prefetch(rows + i, 0, 2);
}

struct Geometry {
    int64_t num_kv_heads, block_size, head_size, group;
    int64_t block_stride() const { return num_kv_heads * block_size * head_size; }
};

// Blocks asked for ahead of the one in use, a K or V row of each for every row read: one block
// ahead, asked for all at once when a block began, left decode attention at 6.8 GB/s of K/V per
// thread on a Xeon whose projections stream their weights at 13 (1 thread, 16 sequences x 1,500
// tokens x 30 layers' caches, randomly placed blocks).
constexpr int64_t kAhead = 2;

// One (sequence, KV head) pair: all `group` query heads that read this KV head. `scores` holds
// group * ctx floats; both passes walk the blocks so that each K and V row is loaded once.
template <typename T>
void attend_one(const float* q, const T* k_cache, const T* v_cache, const int32_t* table,
                int64_t ctx, int64_t kv_head, const Geometry& g, float scale, float* out,
                std::vector<float>& scores) {
    const int64_t hs = g.head_size, bs = g.block_size, group = g.group;
    const int64_t head_offset = kv_head * bs * hs;
    const int64_t num_blocks = (ctx + bs - 1) / bs;
    auto rows = [&](const T* cache, int64_t i) {
        return cache + table[i] * g.block_stride() + head_offset;
    };
    scores.resize(static_cast<size_t>(group * ctx));
    float* sc = scores.data();
    for (int64_t i = 1; i <= kAhead && i < num_blocks; ++i) prefetch_rows(rows(k_cache, i), bs * hs);
    for (int64_t t0 = 0; t0 < ctx; t0 += bs) {
        const int64_t ahead = t0 / bs + kAhead + 1;
        if (ahead < num_blocks) prefetch_rows(rows(k_cache, ahead), bs * hs);
        const int64_t n = std::min(bs, ctx - t0);
        block_group_dots(q, rows(k_cache, t0 / bs), n, group, hs, scale, sc + t0, ctx);
    }
    // The first V blocks, read right after the softmax.
    for (int64_t i = 0; i <= kAhead && i < num_blocks; ++i) prefetch_rows(rows(v_cache, i), bs * hs);
    for (int64_t h = 0; h < group; ++h) {  // softmax per query head; exp(s - max) stays finite
        float* row = sc + h * ctx;
        float max_score = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : max_score)
        for (int64_t t = 0; t < ctx; ++t) max_score = std::max(max_score, row[t]);
        float total = 0.f;
#pragma omp simd reduction(+ : total)
        for (int64_t t = 0; t < ctx; ++t) {
            row[t] = vexp(row[t] - max_score);
            total += row[t];
        }
        const float inv = 1.f / total;
#pragma omp simd
        for (int64_t t = 0; t < ctx; ++t) row[t] *= inv;
    }
    std::fill(out, out + group * hs, 0.f);
    for (int64_t t0 = 0; t0 < ctx; t0 += bs) {
        const int64_t ahead = t0 / bs + kAhead + 1;
        if (ahead < num_blocks) prefetch_rows(rows(v_cache, ahead), bs * hs);
        const int64_t n = std::min(bs, ctx - t0);
        block_group_axpys(sc + t0, ctx, rows(v_cache, t0 / bs), n, group, hs, out);
    }
}

// A sequence's KV heads [head_begin, head_end): what one thread computes in one go.
struct Task {
    int64_t seq, head_begin, head_end;
};

// A head taken apart from its sequence's other heads costs more than its share of the whole:
// a build that made every head a task of its own took 10-16% longer than a static split where
// contexts were equal (2 x 800 and 8 x 500 tokens), and up to 14% longer than whole sequences
// where they differed (ops/bench/results/attention-balance-1206/).
constexpr double kSplitHeadCost = 1.1;

double cost(const Task& t, const int32_t* lens, int64_t num_kv_heads) {
    const int64_t heads = t.head_end - t.head_begin;
    return static_cast<double>(lens[t.seq]) * static_cast<double>(heads) *
           (heads < num_kv_heads ? kSplitHeadCost : 1.0);
}

// The finishing time of the busiest of `threads` threads that take `tasks` in order, each the
// next task as it comes free (the order must be costliest first).
double makespan(const std::vector<Task>& tasks, int threads, const int32_t* lens,
                int64_t num_kv_heads) {
    std::vector<double> busy(static_cast<size_t>(threads), 0.0);
    for (const Task& t : tasks) {
        auto least = std::min_element(busy.begin(), busy.end());
        *least += cost(t, lens, num_kv_heads);
    }
    return *std::max_element(busy.begin(), busy.end());
}

// The step's work as tasks, costliest first, for threads to take as they come free. A task's
// cost is its context times its heads. A static split of the (sequence, head) range in row order
// left one thread most of the work where contexts differed: over 30 layers, 5 sequences of 900,
// 800, 300, 200 and 100 tokens ran 1.20x faster on 2 threads than on 1, against 1.96x for 8
// sequences of 500 (AMX Xeon). Sequences start whole; the costliest whole one is split into
// its heads while that shortens the modelled finishing time (a single sequence, or 5 alike on
// 2 threads, where whole ones would split 3 to 2), at most 2 per thread. Each head computes
// what it did before, so the output is the same whatever thread takes it.
std::vector<Task> balanced_tasks(const int32_t* lens, int64_t num_seqs, int64_t num_kv_heads,
                                 int threads) {
    std::vector<Task> tasks;
    tasks.reserve(static_cast<size_t>(num_seqs * num_kv_heads));
    for (int64_t b = 0; b < num_seqs; ++b) tasks.push_back({b, 0, num_kv_heads});
    auto by_cost = [&](const Task& x, const Task& y) {
        return cost(x, lens, num_kv_heads) > cost(y, lens, num_kv_heads);
    };
    std::stable_sort(tasks.begin(), tasks.end(), by_cost);
    if (threads == 1 || num_kv_heads == 1) return tasks;
    double best = makespan(tasks, threads, lens, num_kv_heads);
    for (int split = 0; split < 2 * threads; ++split) {
        auto whole = std::find_if(tasks.begin(), tasks.end(), [&](const Task& t) {
            return t.head_end - t.head_begin == num_kv_heads;
        });
        if (whole == tasks.end()) break;
        std::vector<Task> trial(tasks);
        trial.erase(trial.begin() + (whole - tasks.begin()));
        for (int64_t h = 0; h < num_kv_heads; ++h) trial.push_back({whole->seq, h, h + 1});
        std::stable_sort(trial.begin(), trial.end(), by_cost);
        const double span = makespan(trial, threads, lens, num_kv_heads);
        if (span >= best) break;
        best = span;
        tasks.swap(trial);
    }
    return tasks;
}

// One K or V row into the cache: a copy, or rounded to bf16 to nearest-even as torch's
// `.to(torch.bfloat16)` rounds (the torch backend's write), so both backends hold the same bits.
inline void store_row(float* dst, const float* src, int64_t n) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}
inline void store_row(c10::BFloat16* dst, const float* src, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst[i] = c10::BFloat16(src[i]);
}

}  // namespace

void paged_decode_attention(at::Tensor out, const at::Tensor& q, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& block_tables,
                            const at::Tensor& seq_lens, double scale) {
    check_rows(out, "out");
    check_rows(q, "q");
    check_cache(k_cache, v_cache);
    check(block_tables, "block_tables", at::kInt, 2);
    check(seq_lens, "seq_lens", at::kInt, 1);
    TORCH_CHECK(block_tables.is_contiguous() && seq_lens.is_contiguous(),
                "block_tables and seq_lens must be contiguous");
    TORCH_CHECK(out.sizes() == q.sizes(), "out and q differ in shape");
    const int64_t num_seqs = q.size(0), num_q_heads = q.size(1), head_size = q.size(2);
    const int64_t num_kv_heads = k_cache.size(1), block_size = k_cache.size(2);
    TORCH_CHECK(k_cache.size(3) == head_size, "head_size differs between q and the cache");
    TORCH_CHECK(num_q_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads");
    TORCH_CHECK(block_tables.size(0) >= num_seqs && seq_lens.size(0) >= num_seqs,
                "fewer block tables or lengths than sequences");
    const Geometry geo{num_kv_heads, block_size, head_size, num_q_heads / num_kv_heads};
    const int64_t max_blocks = block_tables.size(1);
    const int64_t num_blocks = k_cache.size(0);
    const int32_t* tables = block_tables.data_ptr<int32_t>();
    const int32_t* lens = seq_lens.data_ptr<int32_t>();
    for (int64_t b = 0; b < num_seqs; ++b) {
        const int64_t ctx = lens[b];
        TORCH_CHECK(ctx >= 1 && ctx <= max_blocks * block_size, "sequence ", b, " has length ",
                    ctx, " outside its block table");
        check_block_ids(tables + b * max_blocks, ctx, block_size, num_blocks);
    }
    const float* q_ptr = q.data_ptr<float>();
    float* out_ptr = out.data_ptr<float>();
    const int64_t q_row = q.stride(0), out_row = out.stride(0);
    const float scale_f = static_cast<float>(scale);
    const int threads = std::max(1, at::get_num_threads());
    const std::vector<Task> tasks = balanced_tasks(lens, num_seqs, num_kv_heads, threads);
    auto run = [&](const auto* k_ptr, const auto* v_ptr) {
        std::atomic<size_t> next{0};
        // One body per thread, each taking the next task until none is left; nested in another
        // parallel region it runs on the caller alone, which then takes every task.
        at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
            std::vector<float> scores;
            for (size_t i = next.fetch_add(1); i < tasks.size(); i = next.fetch_add(1)) {
                const int64_t b = tasks[i].seq;
                for (int64_t h = tasks[i].head_begin; h < tasks[i].head_end; ++h) {
                    const int64_t head = h * geo.group * head_size;
                    attend_one(q_ptr + b * q_row + head, k_ptr, v_ptr, tables + b * max_blocks,
                               lens[b], h, geo, scale_f, out_ptr + b * out_row + head, scores);
                }
            }
        });
    };
    if (k_cache.scalar_type() == at::kFloat)
        run(k_cache.data_ptr<float>(), v_cache.data_ptr<float>());
    else  // bf16 as its bits: `widen` makes each a float32
        run(static_cast<const uint16_t*>(k_cache.data_ptr()),
            static_cast<const uint16_t*>(v_cache.data_ptr()));
}

void write_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor k_cache,
              at::Tensor v_cache, const at::Tensor& slot_mapping) {
    check_rows(key, "key");
    check_rows(value, "value");
    check_cache(k_cache, v_cache);
    check(slot_mapping, "slot_mapping", at::kLong, 1);
    TORCH_CHECK(slot_mapping.is_contiguous(), "slot_mapping must be contiguous");
    TORCH_CHECK(key.sizes() == value.sizes(), "key and value differ in shape");
    const int64_t num_tokens = key.size(0);
    TORCH_CHECK(slot_mapping.size(0) == num_tokens, "slot_mapping has ", slot_mapping.size(0),
                " slots for ", num_tokens, " tokens");
    TORCH_CHECK(key.size(1) == k_cache.size(1) && key.size(2) == k_cache.size(3),
                "key heads or head_size differ from the cache's");
    const int64_t heads = k_cache.size(1), block_size = k_cache.size(2), hs = k_cache.size(3);
    const int64_t num_slots = k_cache.size(0) * block_size;
    const int64_t* slots = slot_mapping.data_ptr<int64_t>();
    for (int64_t t = 0; t < num_tokens; ++t)
        TORCH_CHECK(slots[t] >= 0 && slots[t] < num_slots, "slot ", slots[t], " out of range");
    const float* k_src = key.data_ptr<float>();
    const float* v_src = value.data_ptr<float>();
    const int64_t k_row = key.stride(0), v_row = value.stride(0);
    auto run = [&](auto* k_dst, auto* v_dst) {
        // 64 tokens x 3 heads x 256 B per task: a decode step's write stays on one thread.
        at::parallel_for(0, num_tokens, 64, [&](int64_t begin, int64_t end) {
            for (int64_t t = begin; t < end; ++t) {
                const int64_t block = slots[t] / block_size, offset = slots[t] % block_size;
                for (int64_t h = 0; h < heads; ++h) {
                    const int64_t dst = ((block * heads + h) * block_size + offset) * hs;
                    store_row(k_dst + dst, k_src + t * k_row + h * hs, hs);
                    store_row(v_dst + dst, v_src + t * v_row + h * hs, hs);
                }
            }
        });
    };
    if (k_cache.scalar_type() == at::kFloat)
        run(k_cache.data_ptr<float>(), v_cache.data_ptr<float>());
    else
        run(k_cache.data_ptr<c10::BFloat16>(), v_cache.data_ptr<c10::BFloat16>());
}

}  // namespace paternoster
