// Paged prefill attention over a bf16 cache in AMX tiles: q.K^T and p.V as bf16 tile products
// accumulated in float32, the softmax in float32 between them.
//
// Why: on an AMX Xeon the cpu backend ran these chunks through torch's SDPA in bf16 (our float32
// kernel, cpu_prefill_attention.cpp, is the slower of the two there: 11.1 against 6.7 ms a layer
// for a 512-token chunk over 1,536 tokens, 2 threads; ops/bench/prefill_attention.py). SDPA
// gathers each sequence's blocks and converts them in Python, one call a sequence; on the
// 64-request mix with a bf16 cache prefill attention took 6.0-6.2 s of a 35-57 s run, more than
// the float32 kernel over a float32 cache (5.1 s). Here a tile product is 16 rows x 16 columns
// over 32 bf16 values; K and V are packed once per (sequence, KV head) in the pair-interleaved
// layout the B operand takes. The same chunk: 2.6 ms against bf16 SDPA's 4.6 in one run
// (prefill_attention_amx_2t.json); the mix's prefill attention 2.2-2.8 s instead of 6.0-6.2.
//
// Rounding as bf16 SDPA's (and llama.cpp's f16 cache): q and the probabilities are rounded to
// bf16 (nearest even), K and V are the cache's own bits, every sum and the output float32.
// Head sizes of 64 and 128 only (q.K^T holds all of a row block's q in tiles); elsewhere, or in
// a build or on a CPU without AMX, the call returns false and the caller keeps SDPA.

#include "cpu_ops.h"
#include "cpu_prefill_tasks.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <vector>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define PATERNOSTER_PREFILL_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace paternoster {
namespace {

#ifdef PATERNOSTER_PREFILL_AMX
constexpr int64_t kRows = 16;        // query rows a tile holds
constexpr int64_t kPair = 32;        // bf16 values along a product's inner dimension (64 bytes)
constexpr int64_t kChunk = 512;      // keys scored before the softmax moves on (32 KB of scores)
constexpr int64_t kTileTokens = 32;  // query tokens per task, as the float32 kernel's
constexpr int64_t kHalf = 64;        // head elements a pass of p.V holds: 4 tiles of 16
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Tile registers: q.K^T keeps scores in 0-1, q in 2-5 (head_size / 32 of them), K in 6-7;
// p.V keeps 64 output columns in 0-3, p in 4, V in 6-7. Every tile is 16 rows of 64 bytes.
struct alignas(64) TileConfig {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// Linux hands out AMX's tile state only to a process that asks (arch_prctl); torch's oneDNN asks
// when it first runs an AMX kernel, which a worker may not have done yet.
bool amx_ready() {
    static const bool ready = [] {
        constexpr int kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
        return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
    }();
    return ready;
}

struct Packed {  // one sequence's K and V for every KV head, keys rounded up to 32
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

// Scores of 16 rows against n32 keys from `key0`: s is 16 x kChunk.
template <int H>
void score_chunk(const uint16_t* q, const uint16_t* kp, int64_t key0, int64_t n32, int64_t hs,
                 float* s) {
    _tile_loadd(2, q, hs * 2);
    _tile_loadd(3, q + kPair, hs * 2);
    if constexpr (H == 4) {
        _tile_loadd(4, q + 2 * kPair, hs * 2);
        _tile_loadd(5, q + 3 * kPair, hs * 2);
    }
    for (int64_t j = 0; j < n32; j += 2 * 16) {
        // A block of 16 keys: head_size / 2 rows of 16 keys x 2 head elements.
        const uint16_t* b0 = kp + (key0 + j) / 16 * hs * 16;
        const uint16_t* b1 = b0 + hs * 16;
        _tile_zero(0);
        _tile_zero(1);
        _tile_loadd(6, b0, 64);
        _tile_dpbf16ps(0, 2, 6);
        _tile_loadd(7, b1, 64);
        _tile_dpbf16ps(1, 2, 7);
        _tile_loadd(6, b0 + 16 * kPair, 64);
        _tile_dpbf16ps(0, 3, 6);
        _tile_loadd(7, b1 + 16 * kPair, 64);
        _tile_dpbf16ps(1, 3, 7);
        if constexpr (H == 4) {
            _tile_loadd(6, b0 + 32 * kPair, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_loadd(7, b1 + 32 * kPair, 64);
            _tile_dpbf16ps(1, 4, 7);
            _tile_loadd(6, b0 + 48 * kPair, 64);
            _tile_dpbf16ps(0, 5, 6);
            _tile_loadd(7, b1 + 48 * kPair, 64);
            _tile_dpbf16ps(1, 5, 7);
        }
        _tile_stored(0, s + j, kChunk * 4);
        _tile_stored(1, s + j + 16, kChunk * 4);
    }
}

// o (16 x hs, float32) += p (16 x n32 bf16) . V of the keys from `key0`.
void add_values(const uint16_t* p, const uint16_t* vp, int64_t key0, int64_t n32, int64_t hs,
                float* o) {
    for (int64_t c = 0; c < hs; c += kHalf) {
        _tile_loadd(0, o + c, hs * 4);
        _tile_loadd(1, o + c + 16, hs * 4);
        _tile_loadd(2, o + c + 32, hs * 4);
        _tile_loadd(3, o + c + 48, hs * 4);
        for (int64_t j = 0; j < n32; j += kPair) {
            // 16 key pairs: rows of head_size x 2 keys, this pass's 64 columns from c.
            const uint16_t* b = vp + (key0 + j) / 2 * hs * 2 + c * 2;
            _tile_loadd(4, p + j, kChunk * 2);
            _tile_loadd(6, b, hs * 4);
            _tile_dpbf16ps(0, 4, 6);
            _tile_loadd(7, b + 32, hs * 4);
            _tile_dpbf16ps(1, 4, 7);
            _tile_loadd(6, b + 64, hs * 4);
            _tile_dpbf16ps(2, 4, 6);
            _tile_loadd(7, b + 96, hs * 4);
            _tile_dpbf16ps(3, 4, 7);
        }
        _tile_stored(0, o + c, hs * 4);
        _tile_stored(1, o + c + 16, hs * 4);
        _tile_stored(2, o + c + 32, hs * 4);
        _tile_stored(3, o + c + 48, hs * 4);
    }
}

// float32 to bf16, nearest even: n a multiple of 16.
void round_row(const float* x, uint16_t* y, int64_t n) {
    for (int64_t i = 0; i < n; i += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
}

struct Work {  // a thread's buffers, reused across its tasks
    std::vector<uint16_t> q, p;
    std::vector<float> s, o, m, l;
    void size(int64_t hs) {
        q.assign(kRows * hs, 0);
        p.assign(kRows * kChunk, 0);
        s.assign(kRows * kChunk, 0.f);
        o.assign(kRows * hs, 0.f);
        m.assign(kRows, 0.f);
        l.assign(kRows, 0.f);
    }
};

// 2^t for t <= 0, 16 lanes: 2^round(t) by scalef, 2^f for |f| <= 1/2 by a degree-5 Taylor
// polynomial (relative error ~2e-7 at |f| = 1/2, far under the bf16 rounding p gets next). With
// the float32 kernel's vexp (~20 instructions a vector) the softmax took about half this
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
void softmax_row(Work& w, int64_t r, int64_t allowed, int64_t n32, int64_t hs, float scale) {
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
template <int H>
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
            score_chunk<H>(w.q.data(), kp, kc, n32, hs, w.s.data());
            for (int64_t r = 0; r < kRows; ++r) {
                // Keys row r may see in this chunk: up to its own position; none past its rows.
                const int64_t seen = r < n_rows ? first_pos + (r0 + r) / a.group + 1 - kc : 0;
                const int64_t allowed = std::clamp<int64_t>(seen, 0, n32);
                if (allowed > 0)
                    softmax_row(w, r, allowed, n32, hs, a.scale);
                else
                    std::fill(w.p.begin() + r * kChunk, w.p.begin() + r * kChunk + n32, 0);
            }
            add_values(w.p.data(), vp, kc, n32, hs, w.o.data());
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

// Each (sequence, KV head)'s K as 16-key blocks of head_size / 2 rows (16 keys x 2 elements)
// and V as key pairs (head_size x 2 keys), zeros past its context.
std::vector<uint16_t> pack(const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const int32_t* tables, int64_t table_stride, const int32_t* lens,
                           int64_t num_seqs, std::vector<Packed>& packed_of) {
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
#endif  // PATERNOSTER_PREFILL_AMX

}  // namespace

bool paged_prefill_attention_amx(at::Tensor out, const at::Tensor& q, const at::Tensor& k_cache,
                                 const at::Tensor& v_cache, const at::Tensor& block_tables,
                                 const at::Tensor& seq_lens, const at::Tensor& query_start_loc,
                                 double scale) {
    check_prefill_args(out, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale);
    TORCH_CHECK(k_cache.scalar_type() == at::kBFloat16, "k_cache must be BFloat16 for AMX");
#ifdef PATERNOSTER_PREFILL_AMX
    const int64_t hs = q.size(2), num_seqs = seq_lens.size(0);
    if ((hs != 64 && hs != 128) || !amx_ready()) return false;
    const std::vector<PrefillTask> tasks =
        prefill_tasks(seq_lens, query_start_loc, k_cache.size(1), kTileTokens);
    if (tasks.empty()) return true;
    const int32_t* lens = seq_lens.data_ptr<int32_t>();
    std::vector<Packed> packed_of(num_seqs);
    const std::vector<uint16_t> packed =
        pack(k_cache, v_cache, block_tables.data_ptr<int32_t>(), block_tables.stride(0), lens,
             num_seqs, packed_of);
    const Args args{q.data_ptr<float>(), q.stride(0), out.data_ptr<float>(), out.stride(0),
                    lens, query_start_loc.data_ptr<int32_t>(), q.size(1) / k_cache.size(1), hs,
                    static_cast<float>(scale), packed.data(), packed_of.data()};
    std::atomic<size_t> next{0};
    const int64_t threads = std::min<int64_t>(at::get_num_threads(), tasks.size());
    at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
        TileConfig config;
        for (int i = 0; i < 8; ++i) {
            config.rows[i] = kRows;
            config.colsb[i] = 64;
        }
        _tile_loadconfig(&config);  // tile state is per thread
        Work work;
        work.size(hs);
        for (size_t i = next++; i < tasks.size(); i = next++) {
            if (hs == 64)
                attend_tile<2>(args, tasks[i], work);
            else
                attend_tile<4>(args, tasks[i], work);
        }
        _tile_release();
    });
    return true;
#else
    return false;  // no AMX in this build: the caller keeps SDPA
#endif
}

}  // namespace paternoster
