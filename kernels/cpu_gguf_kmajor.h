// GGUF blocks stored k-major at load (kernels/quant_reference.py `pack_kmajor`) for
// kernels/cpu_gguf_kmajor.cpp; each ISA's readers and passes: cpu_gguf_kmajor_avx512.h and
// cpu_gguf_kmajor_avx2.h. Per group of 32 weight rows (output columns) and block: the rows' 32
// d (fp16), Q4_1's 32 m, then for each of the block's 32 k one line of the rows' codes: 16
// bytes for 4-bit formats (column c's in byte c % 16, low nibble for c < 16, high for c >= 16),
// 32 for Q8_0 (column c's int8 in byte c). The file's bytes a block a row. A reader turns a k's
// line into the columns' fp32 weights as the file dequantizes them (quant_reference.dequantize):
// fma(q, d, m) rounds once, and so does Q4_0's (q - 8) * d as fma(q, d, -8 d) and Q8_0's q * d.
#pragma once

#include "cpu_quant.h"

namespace paternoster {
namespace kmajor {

using namespace quant;

constexpr int64_t kCols = 32;  // output columns a group

template <int64_t F>
struct Layout {
    static constexpr int64_t kHeads = F == kQ4_1 ? 2 : 1;   // fp16 fields a column: d (and m)
    static constexpr int64_t kLine = F == kQ8_0 ? 32 : 16;  // bytes of one k's codes
    static constexpr int64_t kGroupBlock = 2 * kHeads * kCols + kBlock * kLine;
    static_assert(kGroupBlock == kCols * block_bytes(F), "the file's bytes, rearranged");
};

// 4 group-blocks ahead of the one being read (2.5 KB for Q4_1). Over the 210 Q4_1 projections,
// 1 thread: 2, 4 and 8 ahead were within 5% of each other at 1-24 rows (2026-12-07).
constexpr int64_t kPrefetchBlocks = 4;

template <int64_t F>
inline void prefetch_ahead(const uint8_t* p) {
    constexpr int64_t bytes = Layout<F>::kGroupBlock;
    for (int64_t line = 0; line < bytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBlocks * bytes + line,
                     _MM_HINT_T0);
}

}  // namespace kmajor
}  // namespace paternoster
