#!/bin/bash
# The peers on the bundled model re-encoded as Q8_0 and Q4_0 (ops/bench/requantize_gguf.py):
# ours' default (exact, k-major blocks), ours-a8, ours-fp32 and llama.cpp on the same file,
# full and half scale, 2 rounds each. Run from the repository root.
set -e
OUT=ops/bench/results/formats-1208
mkdir -p /tmp/models
for f in q8_0 q4_0; do
  [ -f /tmp/models/smollm2-$f.gguf ] || .venv/bin/python ops/bench/requantize_gguf.py /tmp/models/smollm2-$f.gguf --format $f
done
for scale in "64 1" "32 0.5"; do
  set -- $scale
  for f in q8_0 q4_0; do
    name=peers_${f}_$([ "$1" = 64 ] && echo full || echo half)
    .venv/bin/python ops/bench/peers/run_peers.py --gguf /tmp/models/smollm2-$f.gguf \
      --num-requests $1 --scale $2 --peers llama.cpp-gguf --local ours-a8,ours-fp32 \
      --threads 2 --rounds 2 --out $OUT/$name.json > $OUT/$name.txt 2>&1
  done
done
