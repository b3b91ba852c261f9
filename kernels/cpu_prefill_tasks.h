// The arguments, the work list and its loop that the prefill kernels share:
// cpu_prefill_attention.cpp (float32 arithmetic, AVX-512) and cpu_prefill_bf16.h's (bf16
// products: AMX tiles or AVX-512 BF16 dot products). Their layout is
// cpu_paged_attention.cpp's; query_start_loc (num_seqs + 1,) int32 gives each sequence's
// queries, the last of its context.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "cpu_ops.h"

namespace paternoster {

// A sequence, a KV head and a tile of query tokens, with its group's query heads.
struct PrefillTask {
    int64_t seq, head, first;  // sequence, KV head, first query token of the tile
    int64_t tokens, keys;      // tokens in the tile; keys its last token sees
};

// Every check of a prefill call's arguments: a RuntimeError naming the bad one.
inline void check_prefill_args(const at::Tensor& out, const at::Tensor& q,
                               const at::Tensor& k_cache, const at::Tensor& v_cache,
                               const at::Tensor& block_tables, const at::Tensor& seq_lens,
                               const at::Tensor& query_start_loc, double scale) {
    check_rows(q, "q");
    check_rows(out, "out");
    check_cache(k_cache, v_cache);
    check(block_tables, "block_tables", at::kInt, 2);
    check(seq_lens, "seq_lens", at::kInt, 1);
    check(query_start_loc, "query_start_loc", at::kInt, 1);
    TORCH_CHECK(block_tables.stride(1) == 1 && seq_lens.is_contiguous() &&
                    query_start_loc.is_contiguous(),
                "block_tables rows, seq_lens and query_start_loc must be contiguous");
    TORCH_CHECK(scale > 0, "scale must be positive, got ", scale);
    const int64_t num_seqs = seq_lens.size(0);
    TORCH_CHECK(query_start_loc.size(0) == num_seqs + 1 && block_tables.size(0) >= num_seqs,
                "query_start_loc must have num_seqs + 1 entries, block_tables a row a sequence");
    TORCH_CHECK(q.sizes() == out.sizes() && k_cache.size(3) == q.size(2) &&
                    q.size(1) % k_cache.size(1) == 0,
                "q and out must match, with head_size and a whole group per KV head");
    const int32_t* lens = seq_lens.data_ptr<int32_t>();
    const int32_t* starts = query_start_loc.data_ptr<int32_t>();
    const int32_t* tables = block_tables.data_ptr<int32_t>();
    const int64_t block_size = k_cache.size(2);
    for (int64_t b = 0; b < num_seqs; ++b) {
        const int64_t q_len = starts[b + 1] - starts[b];
        TORCH_CHECK(q_len >= 0 && q_len <= lens[b] && starts[b + 1] <= q.size(0),
                    "sequence ", b, " has ", q_len, " queries for a context of ", lens[b]);
        TORCH_CHECK((lens[b] + block_size - 1) / block_size <= block_tables.size(1),
                    "sequence ", b, "'s context outruns its block table");
        check_block_ids(tables + b * block_tables.stride(0), lens[b], block_size,
                        k_cache.size(0));
    }
}

// The call's tasks of `tile_tokens` query tokens, costliest first (threads take the next as
// they come free, so the longest go first and the short ones fill the tail).
inline std::vector<PrefillTask> prefill_tasks(const at::Tensor& seq_lens,
                                              const at::Tensor& query_start_loc,
                                              int64_t num_kv_heads, int64_t tile_tokens) {
    const int32_t* lens = seq_lens.data_ptr<int32_t>();
    const int32_t* starts = query_start_loc.data_ptr<int32_t>();
    std::vector<PrefillTask> tasks;
    for (int64_t b = 0; b < seq_lens.size(0); ++b) {
        const int64_t q_len = starts[b + 1] - starts[b];
        for (int64_t first = 0; first < q_len; first += tile_tokens) {
            const int64_t tokens = std::min(tile_tokens, q_len - first);
            for (int64_t h = 0; h < num_kv_heads; ++h)
                tasks.push_back({b, h, first, tokens, lens[b] - q_len + first + tokens});
        }
    }
    std::sort(tasks.begin(), tasks.end(), [](const PrefillTask& x, const PrefillTask& y) {
        return x.tokens * x.keys > y.tokens * y.keys;
    });
    return tasks;
}

// body(task, state) for every task, each thread taking the next as it comes free. A thread makes
// its `state` once, before its first task (its buffers; AMX's tile configuration, which is per
// thread, loaded there and released as the state goes).
template <class MakeState, class Body>
void run_tasks(const std::vector<PrefillTask>& tasks, MakeState make_state, Body body) {
    std::atomic<size_t> next{0};
    const int64_t threads = std::min<int64_t>(at::get_num_threads(), tasks.size());
    at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
        auto state = make_state();
        for (size_t i = next++; i < tasks.size(); i = next++) body(tasks[i], state);
    });
}

}  // namespace paternoster
