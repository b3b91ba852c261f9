#!/usr/bin/env bash
# The half-scale mix of 2026-12-07 (Zen 2): vLLM as it ships (bf16) beside ours and llama.cpp,
# then vLLM in float32 (its faster configuration on a CPU without bf16 arithmetic) beside ours.
set -uo pipefail
R=ops/bench/results/avx2-zen2-1207
PY=.venv/bin/python
echo "== half $(date -u +%H:%M:%S)"
$PY ops/bench/peers/run_peers.py --num-requests 32 --scale 0.5 --threads 2 --rounds 1 \
  --local ours-a8-kvbf16,ours-a8,ours-fp32 --peers llama.cpp-q4_1,vllm-default \
  --out $R/peers_half.json > $R/peers_half.log 2>&1
echo "== half fp32 vLLM $(date -u +%H:%M:%S)"
$PY ops/bench/peers/run_peers.py --num-requests 32 --scale 0.5 --threads 2 --rounds 1 \
  --peers vllm-bind --vllm-dtype float32 \
  --out $R/peers_half_vllm_fp32.json > $R/peers_half_vllm_fp32.log 2>&1
echo "== done $(date -u +%H:%M:%S)"
