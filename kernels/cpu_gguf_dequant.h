// A GGUF block's weights as floats, in registers or into a row of memory: the exact kernels'
// one dequantization (cpu_quant_linear.cpp's registers and `gguf_dequantize`, the tiles of
// cpu_gguf_tile.h), the math of kernels/quant_reference.py `dequantize`.
#pragma once

#include "cpu_quant.h"

namespace paternoster {
namespace quant {

// The block's 32 weights as (elements 0-15, elements 16-31).
template <int64_t F>
inline void dequant(const uint8_t* b, f16v& lo, f16v& hi) {
    const float d = half(b);
    const f16v dv = splat(d);
    if constexpr (F == kQ8_0) {
        lo = widen(load16(b + 2), true) * dv;
        hi = widen(load16(b + 18), true) * dv;
    } else {
        const f16v mv = splat(F == kQ4_1 ? half(b + 2) : -8.0f * d);
        const __m128i q = load16(b + (F == kQ4_1 ? 4 : 2)), low4 = _mm_set1_epi8(0x0F);
        lo = widen(_mm_and_si128(q, low4), false) * dv + mv;
        hi = widen(_mm_and_si128(_mm_srli_epi16(q, 4), low4), false) * dv + mv;
    }
}

template <int64_t F>
inline void dequant_row(const uint8_t* src, int64_t nb, float* dst) {
    for (int64_t b = 0; b < nb; ++b) {
        f16v lo, hi;
        dequant<F>(src + b * block_bytes(F), lo, hi);
        std::memcpy(dst + b * kBlock, &lo, sizeof(lo));
        std::memcpy(dst + b * kBlock + 16, &hi, sizeof(hi));
    }
}

}  // namespace quant
}  // namespace paternoster
