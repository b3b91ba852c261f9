#!/bin/bash
# Single stream (prompt 32, 128 tokens, 2 threads) on each format's file: ours' default (exact),
# a8 and fp32 against llama.cpp on the same file, two alternated rounds. From the repository root.
set -uo pipefail
R=ops/bench/results/formats-1208
PY=.venv/bin/python
Q41=$($PY -c "from worker.models.loader import bundled_model_path; print(bundled_model_path())")
for r in 1 2; do
  for f in q8_0 q4_0 q4_1; do
    gguf=/tmp/models/smollm2-$f.gguf
    [ $f = q4_1 ] && gguf=$Q41
    $PY ops/bench/single_stream.py --model "$gguf" --quantization gguf gguf+a8 none \
      --prompt-tokens 32 --tokens 128 --no-hf --repeats 3 --threads 2 > $R/single_ours_${f}_r$r.txt 2>&1
    .venv-llamacpp/bin/python ops/bench/peers/llamacpp.py \
      --workload ops/bench/results/quant-avx2-1204/w.json --gguf "$gguf" --threads 2 \
      --parallel 1 > $R/single_llama_${f}_r$r.txt 2>&1
  done
done
