// y = x @ (scale[:, None] * W).T + b, W per-channel symmetric int8 (made at load from fp32 or
// bf16 weights: kernels/quant_reference.py), for any row count; 1 byte a weight where fp32
// streams 4. Each 16 codes are widened to floats in registers and multiplied into every row.

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include "cpu_quant.h"

namespace paternoster {

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                       const c10::optional<at::Tensor>& bias) {
    using namespace quant;
    check(weight, "weight", at::kChar, 2);
    TORCH_CHECK(weight.is_contiguous(), "weight must be contiguous");
    const int64_t n = weight.size(0), k = weight.size(1);
    check(scale, "scale", at::kFloat, 1);
    TORCH_CHECK(scale.is_contiguous() && scale.size(0) == n, "scale must hold ", n, " values");
    const float* b = check_x_bias(x, k, n, bias);
    const int64_t rows = x.size(0), ldx = x.stride(0);
    at::Tensor out = at::empty({rows, n}, x.options().memory_format(at::MemoryFormat::Contiguous));
    const float* xp = x.data_ptr<float>();
    const int8_t* wp = weight.data_ptr<int8_t>();
    const float* sp = scale.data_ptr<float>();
    float* op = out.data_ptr<float>();
    // Threads split the weight rows, so each streams its part of W once.
    at::parallel_for(0, (n + kOut - 1) / kOut, 16, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
            const int64_t o0 = p * kOut;
            const int8_t* w = wp + o0 * k;
            if (o0 + kOut <= n)
                dot_rows<int8_t, kOut>(xp, ldx, rows, w, k, k, sp + o0, op + o0, n);
            else
                dot_rows<int8_t, 1>(xp, ldx, rows, w, k, k, sp + o0, op + o0, n);
        }
    });
    add_bias(op, rows, n, b);
    return out;
}

}  // namespace paternoster
