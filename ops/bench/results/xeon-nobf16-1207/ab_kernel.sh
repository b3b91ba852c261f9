#!/usr/bin/env bash
# The exact tile before (stash: main's head) and after (this tree's prefetch), alternated, 1 thread (CPU time):
#   bash ops/bench/results/xeon-nobf16-1207/ab_kernel.sh > ab_kernel_t1.txt
R=ops/bench/results/xeon-nobf16-1207
for i in 1 2; do
  for side in before after; do
    [ $side = before ] && git stash -q
    .venv/bin/python ops/bench/quant_linear.py --rows 8 12 16 32 64 128 --repeats 5 \
      --threads 1 --systems q4_1 q8_0 int8 --out $R/kernel_t1_${side}_$i.json \
      2>&1 | grep rows | sed "s/^/$side $i: /"
    [ $side = before ] && git stash pop -q
  done
done
