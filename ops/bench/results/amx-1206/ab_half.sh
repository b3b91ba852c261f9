#!/bin/bash
# More alternated half-scale pairs (ab_engine.sh's half pairs were 4% apart for ours-kvbf16 and
# -11% / -1% for ours-a8bf16-kvbf16, runs of 9-15 s): ours-a8bf16-kvbf16 alone, 4 pairs.
here=$(cd "$(dirname "$0")" && pwd)
for i in 3 4 5 6; do
  for side in before after; do
    dir=/work/main; [ $side = before ] && dir=/tmp/before
    (cd $dir && .venv/bin/python ops/bench/engine.py --systems ours-a8bf16-kvbf16 --num-requests 32 \
      --scale 0.5 --threads 2 --out $here/engine_half_${side}_$i.json > $here/engine_half_${side}_$i.log 2>&1)
    echo "half $side $i $(date +%T) $(grep -E '^ours' $here/engine_half_${side}_$i.log | tr -s ' ' | cut -d' ' -f1-3 | tr '\n' ' ')"
  done
done
