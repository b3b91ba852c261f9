// Python bindings of our C++ CPU kernels (kernels/cpu_ops.py builds and loads them). Only this
// file includes torch/extension.h (pybind11 and all of torch's headers), which is most of the
// compile time; the kernel sources include ATen's core headers only.
//
// Every kernel runs with the GIL released (``nogil``), as torch's own ops do: they touch no
// Python object, and holding it kept the worker's intake and publisher threads waiting behind
// a whole projection (the interpreter hands the GIL over only at its 5 ms switch interval).

#include <torch/extension.h>

#include "cpu_ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    using namespace paternoster;
    const auto nogil = py::call_guard<py::gil_scoped_release>();
    m.def("paged_decode_attention", &paged_decode_attention,
          "Paged decode attention of one query per sequence into out (float32)", nogil);
    m.def("paged_prefill_attention", &paged_prefill_attention,
          "Causal paged attention of prefill chunks into out (float32 arithmetic over a float32 "
          "or bf16 cache); false if this build has no vector path",
          nogil);
    m.def("paged_prefill_attention_bf16", &paged_prefill_attention_bf16,
          "Causal paged attention of prefill chunks over a bf16 cache with bf16 products into "
          "out: AMX tiles where tiles=True and the CPU has them (heads of 64 and 128), else "
          "AVX-512 BF16 dot products (heads a multiple of 32); false if neither runs",
          py::arg("out"), py::arg("q"), py::arg("k_cache"), py::arg("v_cache"),
          py::arg("block_tables"), py::arg("seq_lens"), py::arg("query_start_loc"),
          py::arg("scale"), py::arg("tiles") = true, nogil);
    m.def("write_kv", &write_kv, "Write key/value rows into the paged caches at slot_mapping",
          nogil);
    m.def("rotary_", &rotary_, "Rotate-half rotary embedding of x (tokens, heads, D) in place",
          nogil);
    m.def("silu_and_mul", &silu_and_mul,
          "silu(gate) * up of gate_up (tokens, 2 I) -> (tokens, I)", nogil);
    m.def("add_rms_norm_", &add_rms_norm_,
          "residual += x, then x = rms_norm(residual) * weight, both in place", nogil);
    m.def("skinny_linear", &skinny_linear, "x @ weight.T + bias for few rows (float32)",
          py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(), nogil);
    m.def("gguf_linear", &gguf_linear,
          "x @ dequantize(blocks).T + bias, blocks (n, row_bytes) uint8 of GGML type format",
          py::arg("x"), py::arg("blocks"), py::arg("format"), py::arg("bias") = py::none(),
          nogil);
    m.def("gguf_linear_q8", &gguf_linear_q8,
          "gguf_linear with x rounded to 8 bits a 32-value block (integer dot products); "
          "panels: blocks stored as quant_reference.pack_panels makes them, in panels of "
          "q8_panel_rows() rows",
          py::arg("x"), py::arg("blocks"), py::arg("format"), py::arg("bias") = py::none(),
          py::arg("panels") = false, nogil);
    m.def("q8_panel_rows", &quant::q8_panel_rows,
          "Weight rows a panel of gguf_linear_q8's stored panels: 16 with AVX-512 VNNI, 8 on "
          "AVX2");
    m.def("gguf_dequantize", &gguf_dequantize,
          "GGUF blocks (n, row_bytes) -> float32 (n, k), or bfloat16 rounded to nearest even; "
          "panel_rows: blocks stored as panels of that many rows (quant_reference.pack_panels)",
          py::arg("blocks"), py::arg("format"), py::arg("bf16") = false,
          py::arg("panel_rows") = 0, nogil);
    m.def("quant_isa", &quant_isa, "The quantized kernels' vector paths: avx512 or avx2");
    m.def("gguf_kmajor_supported", &gguf_kmajor_supported,
          "Whether this build reads blocks of GGML type format stored k-major "
          "(quant_reference.pack_kmajor): Q4_0, Q4_1 and Q8_0 on AVX2 and AVX-512");
    m.def("gguf_linear_kmajor", &gguf_linear_kmajor,
          "gguf_linear over blocks stored as quant_reference.pack_kmajor makes them (exact x)",
          py::arg("x"), py::arg("blocks"), py::arg("format"), py::arg("bias") = py::none(),
          nogil);
    m.def("gguf_dequantize_kmajor", &gguf_dequantize_kmajor,
          "Blocks stored k-major (quant_reference.pack_kmajor) -> float32 (n, k)",
          py::arg("blocks"), py::arg("format"), nogil);
    m.def("gguf_kmajor_rows", &gguf_kmajor_rows,
          "Rows index (int64, 1-D) of blocks stored k-major, in the file's layout (an embedding)",
          py::arg("blocks"), py::arg("format"), py::arg("index"), nogil);
    // module_local: a process can load two builds (native and -march=haswell, as the AVX2
    // tests do), and pybind11 registers a type once per process unless it is local.
    py::class_<DecodeStack>(m, "DecodeStack", py::module_local(),
                            "Every layer of an all-decode step in one call (float32)")
        .def(py::init<int64_t, int64_t, int64_t, double, double, at::Tensor>(),
             py::arg("num_q_heads"), py::arg("num_kv_heads"), py::arg("head_size"),
             py::arg("eps"), py::arg("scale"), py::arg("final_norm"))
        .def("add_linear", &DecodeStack::add_linear, py::arg("kind"), py::arg("weight"),
             py::arg("scale") = py::none(), py::arg("format") = 0, py::arg("bias") = py::none(),
             py::arg("packed") = py::none(), py::arg("skinny_rows") = 0)
        .def("add_layer", &DecodeStack::add_layer, py::arg("input_norm"), py::arg("post_norm"),
             py::arg("q_norm") = py::none(), py::arg("k_norm") = py::none())
        .def("set_caches", &DecodeStack::set_caches)
        .def("forward", &DecodeStack::forward, nogil);
    m.def("int8_linear", &int8_linear, "x @ (scale[:, None] * weight).T + bias, weight int8",
          py::arg("x"), py::arg("weight"), py::arg("scale"), py::arg("bias") = py::none(),
          nogil);
}
