#!/usr/bin/env bash
# A 2-core Xeon whose hypervisor hides AMX, AVX-512 BF16 and FP16 (AVX-512 with VNNI only), 2026-12-07:
# kernels alone, single stream against llama.cpp, then both offline mixes with the peers (vLLM as it
# ships and compiled, llama.cpp as it ships). One benchmark at a time; from the repository root:
#   bash ops/bench/results/xeon-nobf16-1207/run_all.sh [stage ...]   # stages: kern single full half fp32 llama
set -uo pipefail
R=ops/bench/results/xeon-nobf16-1207
PY=.venv/bin/python
GGUF=$($PY -c "from worker.models.loader import bundled_model_path; print(bundled_model_path())")
stages=${*:-kern single full half fp32 llama}
for s in $stages; do
  echo "== $s $(date -u +%H:%M:%S)"
  case $s in
  kern)
    $PY ops/bench/quant_linear.py --rows 1 2 4 8 12 16 32 64 128 512 --repeats 5 --threads 2 \
      --out $R/quant_linear.json > $R/quant_linear.txt 2>&1 ;;
  single)
    for r in 1 2; do
      for t in 1 2; do
        $PY ops/bench/single_stream.py --quantization gguf gguf+a8 none --prompt-tokens 32 \
          --tokens 128 --no-hf --repeats 3 --threads $t > $R/single_ours_t${t}_r$r.txt 2>&1
        .venv-llamacpp/bin/python ops/bench/peers/llamacpp.py \
          --workload ops/bench/results/quant-avx2-1204/w.json --gguf "$GGUF" --threads $t \
          --parallel 1 > $R/single_llama_t${t}_r$r.txt 2>&1
      done
    done ;;
  full)
    $PY ops/bench/peers/run_peers.py --num-requests 64 --scale 1 --threads 2 --rounds 2 \
      --local ours-a8-kvbf16,ours-a8,ours-fp32 --peers vllm-default,vllm-compile,llama.cpp-q4_1 \
      --out $R/peers_full.json > $R/peers_full.log 2>&1 ;;
  half)
    $PY ops/bench/peers/run_peers.py --num-requests 32 --scale 0.5 --threads 2 --rounds 2 \
      --local ours-a8-kvbf16,ours-a8,ours-fp32 --peers vllm-default,vllm-compile,llama.cpp-q4_1 \
      --out $R/peers_half.json > $R/peers_half.log 2>&1 ;;
  fp32)  # vLLM's best here: float32 arithmetic (its bfloat16 runs emulated on this CPU), compiled
    for m in "64 1" "32 0.5"; do set -- $m
      $PY ops/bench/peers/run_peers.py --num-requests $1 --scale $2 --threads 2 --rounds 2 \
        --local ours-a8-kvbf16 --peers vllm-compile --vllm-dtype float32 \
        --out $R/peers_vllm_fp32_$1.json > $R/peers_vllm_fp32_$1.log 2>&1
    done ;;
  llama)  # after llama.cpp's --rounds fix: its two rounds beside ours' at both scales
    for m in "64 1" "32 0.5"; do set -- $m
      $PY ops/bench/peers/run_peers.py --num-requests $1 --scale $2 --threads 2 --rounds 2 \
        --local ours-a8-kvbf16 --peers llama.cpp-q4_1 \
        --out $R/peers_llamacpp_$1.json > $R/peers_llamacpp_$1.log 2>&1
    done ;;
  esac
done
echo "== done $(date -u +%H:%M:%S)"
