// Paged prefill attention over a bf16 cache with bf16 products: AMX tiles where the CPU has
// them (cpu_prefill_amx.cpp), else AVX-512 BF16's dot products (here), on cpu_prefill_bf16.h's
// packing, softmax and loop.
//
// Why: AMD's Zen 4 and Zen 5 have no AMX but multiply bf16 pairs (vdpbf16ps: 16 lanes, each
// a += x0 y0 + x1 y1 in float32, twice the products of a float32 FMA). Over a bf16 cache their
// prefill chunks ran the float32 kernel (cpu_prefill_attention.cpp), which widens every K and V
// value: on a 2-core Zen 4 that was 4.9 s of a 36.7 s run of the 64-request mix
// (ours-a8-kvbf16; `perf record`: 12% of the samples, as much as decode attention).
//   scores: per head element pair, two 16-key vectors of K (the packed block rows) against 8
//           rows' q pairs, broadcast: 16 accumulators;
//   values: per key pair, 4 vectors of V's pair rows (64 head elements) against 4 rows' p pairs,
//           broadcast: 16 accumulators.
// Only the rows a block uses are multiplied. Head sizes a multiple of 32; elsewhere, and in
// builds without AVX-512 BF16, the call returns false and the caller keeps the float32 kernel.

#include "cpu_ops.h"
#include "cpu_prefill_bf16.h"

#include <c10/util/Exception.h>

#include <cstdint>
#include <type_traits>

namespace paternoster {
namespace {

#ifdef PATERNOSTER_PREFILL_BF16
using namespace prefill_bf16;

inline __m512bh load_pairs(const uint16_t* x) { return (__m512bh)_mm512_loadu_si512(x); }

inline __m512bh splat_pair(const uint16_t* x) {  // one pair of bf16 values in every lane
    return (__m512bh)_mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x));
}

// s (R rows of kChunk) = q . K^T over n32 keys from key0, 32 keys (two packed blocks) a pass.
template <int R>
void score_rows(const uint16_t* q, const uint16_t* kp, int64_t key0, int64_t n32, int64_t hs,
                float* s) {
    for (int64_t j = 0; j < n32; j += kPair) {
        const uint16_t* b0 = kp + (key0 + j) / 16 * hs * 16;
        const uint16_t* b1 = b0 + hs * 16;
        __m512 acc[R][2];
        for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        for (int64_t d = 0; d < hs; d += 2) {
            const __m512bh k0 = load_pairs(b0 + d * 16), k1 = load_pairs(b1 + d * 16);
            for (int r = 0; r < R; ++r) {
                const __m512bh x = splat_pair(q + r * hs + d);
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, k0);
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, k1);
            }
        }
        for (int r = 0; r < R; ++r) {
            _mm512_storeu_ps(s + r * kChunk + j, acc[r][0]);
            _mm512_storeu_ps(s + r * kChunk + j + 16, acc[r][1]);
        }
    }
}

// o (R rows of hs) += p . V over n32 keys from key0, NV vectors of 16 head elements from c.
template <int R, int NV>
void value_rows(const uint16_t* p, const uint16_t* vp, int64_t key0, int64_t n32, int64_t hs,
                int64_t c, float* o) {
    __m512 acc[R][NV];
    for (int r = 0; r < R; ++r)
        for (int i = 0; i < NV; ++i) acc[r][i] = _mm512_loadu_ps(o + r * hs + c + i * 16);
    const uint16_t* pair = vp + key0 * hs + c * 2;  // key pair (key0 + j) / 2's row: hs x 2
    for (int64_t j = 0; j < n32; j += 2, pair += 2 * hs) {
        __m512bh x[NV];
        for (int i = 0; i < NV; ++i) x[i] = load_pairs(pair + i * 32);
        for (int r = 0; r < R; ++r) {
            const __m512bh w = splat_pair(p + r * kChunk + j);
            for (int i = 0; i < NV; ++i) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], w, x[i]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int i = 0; i < NV; ++i) _mm512_storeu_ps(o + r * hs + c + i * 16, acc[r][i]);
}

template <int R>
void value_block(const uint16_t* p, const uint16_t* vp, int64_t key0, int64_t n32, int64_t hs,
                 float* o) {
    int64_t c = 0;
    for (; c + 64 <= hs; c += 64) value_rows<R, 4>(p, vp, key0, n32, hs, c, o);
    if (c < hs) value_rows<R, 2>(p, vp, key0, n32, hs, c, o);  // hs % 64 == 32
}

// f(R, r) for rows r .. r + R - 1 of `rows`: blocks of Max, then at most one of each smaller
// power of two (R a compile-time constant).
template <int Max, class F>
void in_blocks(int64_t rows, int64_t r, F&& f) {
    for (; r + Max <= rows; r += Max) f(std::integral_constant<int, Max>{}, r);
    if constexpr (Max > 1) in_blocks<Max / 2>(rows, r, f);
}

// cpu_prefill_bf16.h's products as dot products: rows in blocks of 8 (scores) and 4 (values),
// then the last few in smaller ones.
struct Dots {
    static void scores(const uint16_t* q, const uint16_t* kp, int64_t key0, int64_t n32,
                       int64_t hs, int64_t rows, float* s) {
        in_blocks<8>(rows, 0, [&](auto R, int64_t r) {
            score_rows<decltype(R)::value>(q + r * hs, kp, key0, n32, hs, s + r * kChunk);
        });
    }
    static void values(const uint16_t* p, const uint16_t* vp, int64_t key0, int64_t n32,
                       int64_t hs, int64_t rows, float* o) {
        in_blocks<4>(rows, 0, [&](auto R, int64_t r) {
            value_block<decltype(R)::value>(p + r * kChunk, vp, key0, n32, hs, o + r * hs);
        });
    }
};
#endif  // PATERNOSTER_PREFILL_BF16

}  // namespace

bool paged_prefill_attention_bf16(at::Tensor out, const at::Tensor& q, const at::Tensor& k_cache,
                                  const at::Tensor& v_cache, const at::Tensor& block_tables,
                                  const at::Tensor& seq_lens, const at::Tensor& query_start_loc,
                                  double scale, bool tiles) {
    check_prefill_args(out, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale);
    TORCH_CHECK(k_cache.scalar_type() == at::kBFloat16,
                "k_cache must be BFloat16 for bf16 products");
    if (tiles && prefill_bf16_tiles(out, q, k_cache, v_cache, block_tables, seq_lens,
                                    query_start_loc, scale))
        return true;
#ifdef PATERNOSTER_PREFILL_BF16
    if (q.size(2) % kPair != 0) return false;
    prefill_bf16::prefill<Dots>(out, q, k_cache, v_cache, block_tables, seq_lens,
                                query_start_loc, scale);
    return true;
#else
    return false;  // no AVX-512 BF16 in this build: the caller keeps the float32 kernel or SDPA
#endif
}

}  // namespace paternoster
