// Prefill attention over a bf16 cache with bf16 products: what its two instruction sets share.
// AMX tiles (cpu_prefill_amx.cpp) and AVX-512 BF16's dot products (cpu_prefill_bf16.cpp) both
// multiply pairs of bf16 values into float32 sums, so both read one packing of K and V, made
// once per (sequence, KV head) a call:
//   K: per 16-key block, head_size / 2 rows of 16 keys x 2 head elements (64 bytes: a tile row,
//      or a zmm of 16 keys' pairs);
//   V: per key pair, head_size rows of 2 keys (a zmm: 16 head elements x 2 keys).
// A task's rows (tokens x group) go 16 at a time: q rounded to bf16, scores 512 keys at a time,
// an online float32 softmax whose probabilities are rounded to bf16, then p.V into float32.
// The two products are a policy P:
//   P::scores(q, kp, key0, n32, hs, rows, s): s (16 x kChunk) = q (16 x hs) . K^T, n32 keys
//     from key0 (a multiple of 32); `rows` of the 16 are in use;
//   P::values(p, vp, key0, n32, hs, rows, o): o (16 x hs, float32) += p (16 x kChunk) . V.
//
// Rounding as bf16 SDPA's (and llama.cpp's f16 cache): q and the probabilities are rounded to
// bf16 (nearest even), K and V are the cache's own bits, every sum and the output float32.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu_prefill_tasks.h"

namespace paternoster {

// cpu_prefill_amx.cpp: the call in AMX tiles; false where it cannot run (a build or CPU without
// AMX, heads other than 64 and 128). Arguments checked by the caller.
bool prefill_bf16_tiles(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache,
                        const at::Tensor& v_cache, const at::Tensor& block_tables,
                        const at::Tensor& seq_lens, const at::Tensor& query_start_loc,
                        double scale);

}  // namespace paternoster

#if defined(__AVX512BF16__)
#define PATERNOSTER_PREFILL_BF16 1
#include <immintrin.h>

namespace paternoster {
namespace prefill_bf16 {

constexpr int64_t kRows = 16;        // query rows a block holds (a tile's rows)
constexpr int64_t kPair = 32;        // bf16 values (64 bytes) a product step takes: keys or q's
constexpr int64_t kChunk = 512;      // keys scored before the softmax moves on (32 KB of scores)
constexpr int64_t kTileTokens = 32;  // query tokens per task, as the float32 kernel's
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Packed {  // one sequence's K and V for every KV head, keys rounded up to kPair
    int64_t offset, keys;
};

struct Args {
    const float* q;
    int64_t q_stride;
    float* out;
    int64_t out_stride;
    const int32_t* lens;
    const int32_t* starts;
    int64_t group, hs;
    float scale;
    const uint16_t* packed;  // per sequence: K then V, a KV head after another
    const Packed* packed_of;
};

struct Work {  // a thread's buffers, reused across its tasks
    std::vector<uint16_t> q, p;
    std::vector<float> s, o, m, l;
    explicit Work(int64_t hs)
        : q(kRows * hs), p(kRows * kChunk), s(kRows * kChunk), o(kRows * hs), m(kRows),
          l(kRows) {}
};

// float32 to bf16, nearest even: n a multiple of 16.
inline void round_row(const float* x, uint16_t* y, int64_t n) {
    for (int64_t i = 0; i < n; i += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
}

// 2^t for t <= 0, 16 lanes: 2^round(t) by scalef, 2^f for |f| <= 1/2 by a degree-5 Taylor
// polynomial (relative error ~2e-7 at |f| = 1/2, far under the bf16 rounding p gets next). With
// the float32 kernel's vexp (~20 instructions a vector) the softmax took about half the AMX
// kernel's samples (perf record, 512 queries over 1,536 keys, 1 thread), more than both tile
// products; with this one the call took 2.6 ms instead of 4.2 (2 threads).
inline __m512 exp2_16(__m512 t) {
    t = _mm512_max_ps(t, _mm512_set1_ps(-126.f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.3333558e-3f);  // ln2^5 / 5!
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
}

inline __mmask16 first_lanes(int64_t n) {  // lanes below n of 16
    return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << std::max<int64_t>(n, 0)) - 1);
}

// Row r's probabilities for the chunk (n32 keys, the first `allowed` visible) into p as bf16,
// the running max (of scores x scale x log2 e, so every exponent is a power of 2) and sum updated
// and o's row rescaled.
inline void softmax_row(Work& w, int64_t r, int64_t allowed, int64_t n32, int64_t hs,
                        float scale) {
    const float* sr = w.s.data() + r * kChunk;
    uint16_t* pr = w.p.data() + r * kChunk;
    __m512 top = _mm512_set1_ps(kNegInf);
    for (int64_t j = 0; j < allowed; j += 16)
        top = _mm512_mask_max_ps(top, first_lanes(allowed - j), top, _mm512_loadu_ps(sr + j));
    const float log2_scale = scale * 1.44269504f;
    const float m_new = std::max(w.m[r], _mm512_reduce_max_ps(top) * log2_scale);  // scale > 0
    const float alpha = w.m[r] == kNegInf ? 0.f : std::exp2(w.m[r] - m_new);
    const __m512 k = _mm512_set1_ps(log2_scale), m = _mm512_set1_ps(m_new);
    __m512 total = _mm512_setzero_ps();
    for (int64_t j = 0; j < n32; j += 16) {
        const __m512 t = _mm512_fmsub_ps(_mm512_loadu_ps(sr + j), k, m);
        const __m512 e = _mm512_maskz_mov_ps(first_lanes(allowed - j), exp2_16(t));
        total = _mm512_add_ps(total, e);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(pr + j), (__m256i)_mm512_cvtneps_pbh(e));
    }
    w.l[r] = w.l[r] * alpha + _mm512_reduce_add_ps(total);
    w.m[r] = m_new;
    if (alpha != 1.f) {
        float* orow = w.o.data() + r * hs;
#pragma omp simd
        for (int64_t c = 0; c < hs; ++c) orow[c] *= alpha;
    }
}

// One task's rows, 16 at a time, over its keys chunk by chunk.
template <class P>
void attend_tile(const Args& a, const PrefillTask& t, Work& w) {
    const int64_t rows = t.tokens * a.group, hs = a.hs;
    const int64_t q_len = a.starts[t.seq + 1] - a.starts[t.seq];
    const int64_t first_pos = a.lens[t.seq] - q_len + t.first;  // the tile's first position
    const Packed& pk = a.packed_of[t.seq];
    const uint16_t* kp = a.packed + pk.offset + t.head * 2 * pk.keys * hs;
    const uint16_t* vp = kp + pk.keys * hs;
    for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
        const int64_t n_rows = std::min(kRows, rows - r0);
        std::fill(w.q.begin(), w.q.end(), 0);
        for (int64_t r = 0; r < n_rows; ++r) {
            const int64_t token = a.starts[t.seq] + t.first + (r0 + r) / a.group;
            const int64_t head = t.head * a.group + (r0 + r) % a.group;
            round_row(a.q + token * a.q_stride + head * hs, w.q.data() + r * hs, hs);
        }
        std::fill(w.o.begin(), w.o.end(), 0.f);
        std::fill(w.m.begin(), w.m.end(), kNegInf);
        std::fill(w.l.begin(), w.l.end(), 0.f);
        const int64_t keys = first_pos + (r0 + n_rows - 1) / a.group + 1;  // the block's last row
        for (int64_t kc = 0; kc < keys; kc += kChunk) {
            const int64_t n32 = (std::min(kChunk, keys - kc) + kPair - 1) / kPair * kPair;
            P::scores(w.q.data(), kp, kc, n32, hs, n_rows, w.s.data());
            for (int64_t r = 0; r < kRows; ++r) {
                // Keys row r may see in this chunk: up to its own position; none past its rows.
                const int64_t seen = r < n_rows ? first_pos + (r0 + r) / a.group + 1 - kc : 0;
                const int64_t allowed = std::clamp<int64_t>(seen, 0, n32);
                if (allowed > 0)
                    softmax_row(w, r, allowed, n32, hs, a.scale);
                else
                    std::fill(w.p.begin() + r * kChunk, w.p.begin() + r * kChunk + n32, 0);
            }
            P::values(w.p.data(), vp, kc, n32, hs, n_rows, w.o.data());
        }
        for (int64_t r = 0; r < n_rows; ++r) {
            const int64_t token = a.starts[t.seq] + t.first + (r0 + r) / a.group;
            const int64_t head = t.head * a.group + (r0 + r) % a.group;
            float* dst = a.out + token * a.out_stride + head * hs;
            const float inv = 1.f / w.l[r];
            const float* orow = w.o.data() + r * hs;
#pragma omp simd
            for (int64_t c = 0; c < hs; ++c) dst[c] = orow[c] * inv;
        }
    }
}

// Each (sequence, KV head)'s K and V in the layouts above, zeros past its context.
inline std::vector<uint16_t> pack(const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const int32_t* tables, int64_t table_stride,
                                  const int32_t* lens, int64_t num_seqs,
                                  std::vector<Packed>& packed_of) {
    const int64_t heads = k_cache.size(1), block_size = k_cache.size(2), hs = k_cache.size(3);
    int64_t total = 0;
    for (int64_t b = 0; b < num_seqs; ++b) {
        const int64_t keys = (lens[b] + kPair - 1) / kPair * kPair;
        packed_of[b] = Packed{total, keys};
        total += heads * 2 * keys * hs;
    }
    std::vector<uint16_t> packed(total, 0);
    const auto* k = static_cast<const uint16_t*>(k_cache.data_ptr());
    const auto* v = static_cast<const uint16_t*>(v_cache.data_ptr());
    const int64_t block_elems = heads * block_size * hs;
    at::parallel_for(0, num_seqs * heads, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const int64_t b = i / heads, h = i % heads, keys = packed_of[b].keys;
            uint16_t* kp = packed.data() + packed_of[b].offset + h * 2 * keys * hs;
            uint16_t* vp = kp + keys * hs;
            for (int64_t key = 0; key < lens[b]; ++key) {
                const int64_t at = tables[b * table_stride + key / block_size] * block_elems +
                                   (h * block_size + key % block_size) * hs;
                uint16_t* kd = kp + key / 16 * hs * 16 + key % 16 * 2;
                uint16_t* vd = vp + key / 2 * hs * 2 + key % 2;
                for (int64_t d = 0; d < hs; ++d) {
                    kd[d / 2 * 32 + d % 2] = k[at + d];
                    vd[d * 2] = v[at + d];
                }
            }
        }
    });
    return packed;
}

// The call with products P. Each thread makes a State(head_size): a Work, or one that also sets
// up what P needs per thread while it lives. Arguments checked by the caller.
template <class P, class State = Work>
void prefill(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache,
             const at::Tensor& v_cache, const at::Tensor& block_tables,
             const at::Tensor& seq_lens, const at::Tensor& query_start_loc, double scale) {
    const int64_t hs = q.size(2), num_seqs = seq_lens.size(0);
    const std::vector<PrefillTask> tasks =
        prefill_tasks(seq_lens, query_start_loc, k_cache.size(1), kTileTokens);
    if (tasks.empty()) return;
    const int32_t* lens = seq_lens.data_ptr<int32_t>();
    std::vector<Packed> packed_of(num_seqs);
    const std::vector<uint16_t> packed =
        pack(k_cache, v_cache, block_tables.data_ptr<int32_t>(), block_tables.stride(0), lens,
             num_seqs, packed_of);
    const Args args{q.data_ptr<float>(), q.stride(0), out.data_ptr<float>(), out.stride(0),
                    lens, query_start_loc.data_ptr<int32_t>(), q.size(1) / k_cache.size(1), hs,
                    static_cast<float>(scale), packed.data(), packed_of.data()};
    run_tasks(
        tasks, [&] { return State(hs); },
        [&](const PrefillTask& t, Work& work) { attend_tile<P>(args, t, work); });
}

}  // namespace prefill_bf16
}  // namespace paternoster

#endif  // __AVX512BF16__
