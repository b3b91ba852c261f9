#!/bin/bash
# Decode attention's prefetch distance (kAhead in kernels/cpu_paged_attention.cpp) on this CPU:
# the kernel built standalone with kAhead = 2 (as shipped), 4, 8, 16; huge pages, scattered
# blocks, 30 layers, medians of 7 alternated rounds (attn_ahead_ab.py). From the repository root.
set -e
mkdir -p /tmp/attn_exp && cp kernels/cpu_*.h /tmp/attn_exp/
cat > /tmp/attn_exp/bind.cpp <<'CPP'
#include <torch/extension.h>
#include "cpu_ops.h"
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("paged_decode_attention", &paternoster::paged_decode_attention); }
CPP
for a in 2 4 8 16; do
  sed "s/constexpr int64_t kAhead = 2;/constexpr int64_t kAhead = $a;/" kernels/cpu_paged_attention.cpp \
    > /tmp/attn_exp/attn_a$a.cpp
done
.venv/bin/python ops/bench/results/prof-1208/attn_ahead_ab.py a2,a4,a8,a16
