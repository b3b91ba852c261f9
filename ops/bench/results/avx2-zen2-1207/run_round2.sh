#!/usr/bin/env bash
# Second rounds of 2026-12-07 (Zen 2), then vLLM as it ships (bf16) on the full-scale mix.
set -uo pipefail
R=ops/bench/results/avx2-zen2-1207
PY=.venv/bin/python
echo "== full r2 $(date -u +%H:%M:%S)"
$PY ops/bench/peers/run_peers.py --num-requests 64 --scale 1 --threads 2 --rounds 1 \
  --local ours-a8-kvbf16,ours-a8,ours-fp32 --peers llama.cpp-q4_1,vllm-bind \
  --vllm-dtype float32 --out $R/peers_full_r2.json > $R/peers_full_r2.log 2>&1
echo "== half r2 $(date -u +%H:%M:%S)"
$PY ops/bench/peers/run_peers.py --num-requests 32 --scale 0.5 --threads 2 --rounds 1 \
  --local ours-a8-kvbf16,ours-a8,ours-fp32 --peers llama.cpp-q4_1,vllm-bind \
  --vllm-dtype float32 --out $R/peers_half_r2.json > $R/peers_half_r2.log 2>&1
echo "== full vllm-default $(date -u +%H:%M:%S)"
$PY ops/bench/peers/run_peers.py --num-requests 64 --scale 1 --threads 2 --rounds 1 \
  --peers vllm-default --out $R/peers_full_vllm_default.json \
  > $R/peers_full_vllm_default.log 2>&1
echo "== done $(date -u +%H:%M:%S)"
