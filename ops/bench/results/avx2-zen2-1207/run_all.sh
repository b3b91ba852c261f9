#!/usr/bin/env bash
# The native AVX2 (Zen 2) sequence of 2026-12-07: kernels alone, single stream against llama.cpp,
# then the offline mixes with the peers. One benchmark at a time; run from the repository root:
#   bash ops/bench/results/avx2-zen2-1207/run_all.sh [stage ...]   # stages: kern single full half
set -uo pipefail
R=ops/bench/results/avx2-zen2-1207
PY=.venv/bin/python
GGUF=$($PY -c "from worker.models.loader import bundled_model_path; print(bundled_model_path())")
stages=${*:-kern single full half}
for s in $stages; do
  echo "== $s $(date -u +%H:%M:%S)"
  case $s in
  kern)
    $PY ops/bench/quant_linear.py --rows 1 2 3 4 6 8 16 32 64 96 128 --repeats 5 \
      --out $R/quant_linear.json > $R/quant_linear.txt 2>&1 ;;
  single)
    for t in 1 2; do
      $PY ops/bench/single_stream.py --quantization gguf gguf+a8 none --prompt-tokens 32 \
        --tokens 128 --no-hf --repeats 3 --threads $t > $R/single_ours_t$t.txt 2>&1
      for r in 1 2; do
        .venv-llamacpp/bin/python ops/bench/peers/llamacpp.py \
          --workload ops/bench/results/quant-avx2-1204/w.json --gguf "$GGUF" --threads $t \
          --parallel 1 > $R/single_llama_t${t}_r$r.txt 2>&1
      done
    done ;;
  full)
    $PY ops/bench/peers/run_peers.py --num-requests 64 --scale 1 --threads 2 --rounds 1 \
      --local ours-a8-kvbf16,ours-a8,ours-fp32 --peers llama.cpp-q4_1,vllm-bind \
      --vllm-dtype float32 --out $R/peers_full.json > $R/peers_full.log 2>&1 ;;
  half)
    $PY ops/bench/peers/run_peers.py --num-requests 32 --scale 0.5 --threads 2 --rounds 1 \
      --local ours-a8-kvbf16,ours-a8,ours-fp32 --peers llama.cpp-q4_1,vllm-default \
      --out $R/peers_half.json > $R/peers_half.log 2>&1 ;;
  esac
done
echo "== done $(date -u +%H:%M:%S)"
