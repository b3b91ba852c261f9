// Paged prefill attention over a bf16 cache in AMX tiles: q.K^T and p.V as bf16 tile products
// accumulated in float32 (a tile product is 16 rows x 16 columns over 32 bf16 values), on
// cpu_prefill_bf16.h's packing, softmax and loop.
//
// Why: on an AMX Xeon the cpu backend ran these chunks through torch's SDPA in bf16 (our float32
// kernel, cpu_prefill_attention.cpp, is the slower of the two there: 11.1 against 6.7 ms a layer
// for a 512-token chunk over 1,536 tokens, 2 threads; ops/bench/prefill_attention.py). SDPA
// gathers each sequence's blocks and converts them in Python, one call a sequence; on the
// 64-request mix with a bf16 cache prefill attention took 6.0-6.2 s of a 35-57 s run, more than
// the float32 kernel over a float32 cache (5.1 s). The same chunk here: 2.6 ms against bf16
// SDPA's 4.6 in one run (prefill_attention_amx_2t.json); the mix's prefill attention 2.2-2.8 s
// instead of 6.0-6.2.
//
// Head sizes of 64 and 128 only (q.K^T holds all of a row block's q in tiles); elsewhere, or in
// a build or on a CPU without AMX, prefill_bf16_tiles returns false and
// paged_prefill_attention_bf16 (cpu_prefill_bf16.cpp) runs its dot products instead.

#include "cpu_prefill_bf16.h"

#include <cstdint>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(PATERNOSTER_PREFILL_BF16)
#define PATERNOSTER_PREFILL_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace paternoster {
namespace {

#ifdef PATERNOSTER_PREFILL_AMX
using namespace prefill_bf16;

constexpr int64_t kHalf = 64;  // head elements a pass of p.V holds: 4 tiles of 16

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

// cpu_prefill_bf16.h's products in tiles: all 16 rows of a block, used or not (a tile product
// costs the same).
struct Tiles {
    static void scores(const uint16_t* q, const uint16_t* kp, int64_t key0, int64_t n32,
                       int64_t hs, int64_t, float* s) {
        if (hs == 64)
            score_chunk<2>(q, kp, key0, n32, hs, s);
        else
            score_chunk<4>(q, kp, key0, n32, hs, s);
    }
    static void values(const uint16_t* p, const uint16_t* vp, int64_t key0, int64_t n32,
                       int64_t hs, int64_t, float* o) {
        add_values(p, vp, key0, n32, hs, o);
    }
};

// A thread's state: its buffers, and the tile configuration (per thread) loaded while it lives.
struct TileThread : Work {
    explicit TileThread(int64_t hs) : Work(hs) {
        TileConfig config;
        for (int i = 0; i < 8; ++i) {
            config.rows[i] = kRows;
            config.colsb[i] = 64;
        }
        _tile_loadconfig(&config);
    }
    ~TileThread() { _tile_release(); }
    TileThread(const TileThread&) = delete;
    TileThread& operator=(const TileThread&) = delete;
};
#endif  // PATERNOSTER_PREFILL_AMX

}  // namespace

bool prefill_bf16_tiles(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache,
                        const at::Tensor& v_cache, const at::Tensor& block_tables,
                        const at::Tensor& seq_lens, const at::Tensor& query_start_loc,
                        double scale) {
#ifdef PATERNOSTER_PREFILL_AMX
    const int64_t hs = q.size(2);
    if ((hs != 64 && hs != 128) || !amx_ready()) return false;
    prefill_bf16::prefill<Tiles, TileThread>(out, q, k_cache, v_cache, block_tables, seq_lens,
                                             query_start_loc, scale);
    return true;
#else
    return false;
#endif
}

}  // namespace paternoster
