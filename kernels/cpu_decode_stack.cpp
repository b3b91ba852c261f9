// Every decoder layer of a decode step in one call: the same kernels the Python layers call, in
// the same order on the same tensors, without the interpreter between them.
//
// A single-stream token of SmolLM2-135M on its Q4_1 blocks took 10.1-10.4 CPU ms on 1 thread of a
// Zen 5 EPYC, about 8 of them in the quantized projections and most of the rest the layers'
// Python (module calls, views, checks: ~30 calls a layer, 30 layers). Here a layer is ~15
// ATen/kernel calls with no Python in between, and the GIL is released for all of them: 8.5-8.6
// CPU ms a token (BENCHMARKS.md, issue 23's third pass). The result is bit-identical to the
// Python path (tests/models/test_decode_stack.py): same kernels, same arguments, same order.
//
// It takes steps whose rows are all decodes, no padding rows, float32, few enough rows that each
// projection's Python path would have called what its `Linear` calls (the caller,
// worker/models/decode_stack.py, decides; this file only checks shapes).

#include "cpu_ops.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/rms_norm.h>
#include <c10/util/Exception.h>

#include <string>
#include <utility>
#include <vector>

namespace paternoster {

namespace {

// `worker.models.layers.rotate`'s ops, in its order: rotate-half of every head into a new tensor.
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    const int64_t half = x.size(-1) / 2;
    const at::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
    return at::cat({x1.mul(cos).sub(x2.mul(sin)), x2.mul(cos).add(x1.mul(sin))}, -1);
}

// oneDNN's GEMM on a weight it packed at load (`PackedLinear.packed`), as
// ``torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")`` calls it.
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& packed,
                         const c10::optional<at::Tensor>& bias) {
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
    std::vector<c10::IValue> stack{x, packed, bias, std::string("none"),
                                   c10::List<c10::optional<at::Scalar>>(), std::string("")};
    op.callBoxed(&stack);
    return stack[0].toTensor();
}

}  // namespace

at::Tensor DecodeStack::Linear::operator()(const at::Tensor& x) const {
    switch (kind) {
        case kFloat32:  // `PackedLinear.forward`: few rows on the plain weight, if it kept one
            if (weight.defined() && x.size(0) <= skinny_rows) return skinny_linear(x, weight, bias);
            return onednn_linear(x, packed, bias);
        case kGguf:  // `QuantLinear.forward`: x rounded to 8 bits up to skinny_rows
            if (x.size(0) <= skinny_rows) return gguf_linear_q8(x, weight, format, bias, false);
            return gguf_linear(x, weight, format, bias);
        case kGgufPanels:  // x rounded to 8 bits at every row count
            return gguf_linear_q8(x, weight, format, bias, true);
        case kGgufKmajor:  // exact x at every row count the stack takes
            return gguf_linear_kmajor(x, weight, format, bias);
        default:
            return int8_linear(x, weight, scale, bias);
    }
}

DecodeStack::DecodeStack(int64_t num_q_heads, int64_t num_kv_heads, int64_t head_size,
                         double eps, double scale, at::Tensor final_norm)
    : num_q_heads_(num_q_heads),
      num_kv_heads_(num_kv_heads),
      head_size_(head_size),
      eps_(eps),
      scale_(scale),
      final_norm_(std::move(final_norm)) {
    TORCH_CHECK(num_q_heads > 0 && num_kv_heads > 0 && num_q_heads % num_kv_heads == 0,
                "query heads must be a positive multiple of KV heads");
    TORCH_CHECK(head_size > 0 && head_size % 2 == 0, "head_size must be even, is ", head_size);
    check(final_norm_, "final_norm", at::kFloat, 1);
}

void DecodeStack::add_linear(int64_t kind, c10::optional<at::Tensor> weight,
                             c10::optional<at::Tensor> scale, int64_t format,
                             c10::optional<at::Tensor> bias, c10::optional<at::Tensor> packed,
                             int64_t skinny_rows) {
    TORCH_CHECK(kind == kFloat32 || kind == kGguf || kind == kInt8 || kind == kGgufPanels ||
                    kind == kGgufKmajor,
                "unknown linear kind ", kind);
    TORCH_CHECK(kind != kInt8 || scale.has_value(), "an int8 linear needs its scale");
    TORCH_CHECK(kind != kFloat32 || packed.has_value(), "a float32 linear needs its packed weight");
    TORCH_CHECK(kind == kFloat32 || weight.has_value(), "a quantized linear needs its weight");
    Linear linear{kind,   weight.value_or(at::Tensor()), scale.value_or(at::Tensor()),
                  format, std::move(bias),               packed.value_or(at::Tensor()),
                  skinny_rows};
    linears_.push_back(std::move(linear));
}

void DecodeStack::add_layer(at::Tensor input_norm, at::Tensor post_norm,
                            c10::optional<at::Tensor> q_norm, c10::optional<at::Tensor> k_norm) {
    check(input_norm, "input_norm", at::kFloat, 1);
    check(post_norm, "post_norm", at::kFloat, 1);
    TORCH_CHECK(linears_.size() == 4 * (norms_.size() + 1),
                "add qkv, o, gate_up and down (add_linear) before each layer's norms");
    TORCH_CHECK(q_norm.has_value() == k_norm.has_value(), "q and k norms come together");
    TORCH_CHECK(q_norms_.size() == (q_norm.has_value() ? norms_.size() : 0),
                "every layer or none has q and k norms");
    norms_.emplace_back(std::move(input_norm), std::move(post_norm));
    if (q_norm.has_value()) q_norms_.emplace_back(*std::move(q_norm), *std::move(k_norm));
}

void DecodeStack::set_caches(std::vector<at::Tensor> k_caches, std::vector<at::Tensor> v_caches) {
    TORCH_CHECK(k_caches.size() == norms_.size() && v_caches.size() == norms_.size(),
                "one K and one V cache per layer: ", norms_.size());
    k_caches_ = std::move(k_caches);
    v_caches_ = std::move(v_caches);
}

// hidden (T, H): the step's embeddings, used as the residual stream (written in place).
// cos, sin (T, 1, D/2): rotary of each row's position. slot_mapping (T,) int64; block_tables
// (>= T, W) and seq_lens (>= T,) int32 as `paged_decode_attention` takes them.
at::Tensor DecodeStack::forward(at::Tensor hidden, const at::Tensor& cos, const at::Tensor& sin,
                                const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                                const at::Tensor& seq_lens) const {
    check(hidden, "hidden", at::kFloat, 2);
    TORCH_CHECK(hidden.is_contiguous(), "hidden must be contiguous");
    TORCH_CHECK(!norms_.empty() && k_caches_.size() == norms_.size(),
                "the stack has no layers or no caches (set_caches)");
    const int64_t tokens = hidden.size(0);
    const int64_t q_size = num_q_heads_ * head_size_, kv_size = num_kv_heads_ * head_size_;
    at::Tensor residual = hidden;
    // Layer 0's input norm has no residual to add: torch's rms_norm, as `RMSNorm.forward`.
    at::Tensor x = at::rms_norm(residual, {hidden.size(1)}, norms_[0].first, eps_);
    for (size_t i = 0; i < norms_.size(); ++i) {
        const Linear* lin = &linears_[4 * i];
        if (i > 0) add_rms_norm_(x, residual, norms_[i].first, eps_);
        const at::Tensor qkv = lin[0](x);  // (T, q + 2 kv)
        const at::Tensor v =
            qkv.narrow(1, q_size + kv_size, kv_size).view({tokens, num_kv_heads_, head_size_});
        at::Tensor q, k;
        if (q_norms_.empty()) {
            // q and k rotate as one (T, Hq + Hkv, D) view, in place.
            at::Tensor qk = qkv.narrow(1, 0, q_size + kv_size)
                                .view({tokens, num_q_heads_ + num_kv_heads_, head_size_});
            rotary_(qk, cos, sin);
            q = qk.narrow(1, 0, num_q_heads_);
            k = qk.narrow(1, num_q_heads_, num_kv_heads_);
        } else {  // Qwen3: each head normed, then rotated by torch's ops, as `Attention` does
            q = rotate(at::rms_norm(qkv.narrow(1, 0, q_size).view({tokens, num_q_heads_, head_size_}),
                                    {head_size_}, q_norms_[i].first, eps_),
                       cos, sin);
            k = rotate(at::rms_norm(qkv.narrow(1, q_size, kv_size)
                                        .view({tokens, num_kv_heads_, head_size_}),
                                    {head_size_}, q_norms_[i].second, eps_),
                       cos, sin);
        }
        write_kv(k, v, k_caches_[i], v_caches_[i], slot_mapping);
        at::Tensor attn = at::empty({tokens, num_q_heads_, head_size_}, hidden.options());
        paged_decode_attention(attn, q, k_caches_[i], v_caches_[i], block_tables, seq_lens,
                               scale_);
        x = lin[1](attn.view({tokens, q_size}));
        add_rms_norm_(x, residual, norms_[i].second, eps_);
        x = lin[3](silu_and_mul(lin[2](x)));
    }
    add_rms_norm_(x, residual, final_norm_, eps_);
    return x;
}

}  // namespace paternoster
