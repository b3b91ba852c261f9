#!/bin/bash
# Alternated before/after runs of ops/bench/engine.py, ours-kvbf16 and ours-a8-kvbf16 in one
# process a side: full scale, half, full, half. Before = a worktree of 7a5677b at /tmp/before
# (the float32 kernel widening a bf16 cache on this Zen 4), after = /work/main (AVX-512 BF16 dot
# products). Files land here.
here=$(cd "$(dirname "$0")" && pwd)
for spec in "64 1 full" "32 0.5 half" "64 1 full" "32 0.5 half"; do
  set -- $spec
  for side in before after; do
    dir=/work/main; [ $side = before ] && dir=/tmp/before
    n=$(ls $here/engine_${3}_${side}_*.json 2>/dev/null | wc -l); i=$((n+1))
    (cd $dir && .venv/bin/python ops/bench/engine.py --systems ours-kvbf16,ours-a8-kvbf16 --num-requests $1 \
      --scale $2 --threads 2 --out $here/engine_${3}_${side}_$i.json > $here/engine_${3}_${side}_$i.log 2>&1)
    echo "$3 $side $i $(date +%T) $(grep -E '^ours' $here/engine_${3}_${side}_$i.log | tr -s ' ' | cut -d' ' -f1-3 | tr '\n' ' ')"
  done
done
