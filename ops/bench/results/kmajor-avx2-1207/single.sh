#!/bin/bash
# 2026-12-07, Zen 5: ours' default (exact Q4_1) single stream before (worktree of 84cdde5 at
# /tmp/before) and after the AVX2 k-major kernel, on the AVX2 build (ab.sh's ARCH=haswell), then
# llama.cpp built for AVX2 alone (.venv-llamacpp/llama-server-avx2: cmake -DGGML_NATIVE=OFF
# -DGGML_AVX2=ON -DGGML_AVX512=OFF, what setup_llamacpp.sh's LLAMACPP_AVX2=1 builds since) and as
# setup_llamacpp.sh builds it (native), alternated. The AVX2 "after" here is the kernel before
# its tile (16+ rows); single_avx2_after_tile_*.txt, single_native_*.txt and llamacpp_*_s*.txt
# are the later runs (BENCHMARKS.md).
cd /work/main
R=$(cd "$(dirname "$0")" && pwd)
G=$(.venv/bin/python -c "from worker.models.loader import bundled_model_path; print(bundled_model_path())")
OUT=$R ARCH=haswell QUANT=gguf bash ops/bench/results/avx2-panels-1206/ab.sh single
for i in 1 2; do
  for build in avx2 native; do
    server=.venv-llamacpp/llama-server/bin/llama-server
    [ $build = avx2 ] && server=.venv-llamacpp/llama-server-avx2/bin/llama-server
    .venv-llamacpp/bin/python ops/bench/peers/llamacpp.py --workload \
      ops/bench/results/quant-avx2-1204/w.json --gguf "$G" --threads 2 --parallel 1 \
      --server $server > $R/llamacpp_${build}_$i.txt 2>&1
    echo "llama.cpp $build $i $(date +%T) $(tail -1 $R/llamacpp_${build}_$i.txt | cut -c1-300)"
  done
done
