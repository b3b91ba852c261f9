#!/bin/bash
# Alternated before/after runs of ops/bench/engine.py, ours-a8 and ours-a8-kvbf16 in one
# process a side: full scale, half, full, half. Before = a worktree of 410c218 at /tmp/before
# (the 8-bit GEMM transposing each panel per call), after = /work/main (weights stored as
# panels). Files land here.
here=$(cd "$(dirname "$0")" && pwd)
for spec in "64 1 full" "32 0.5 half" "64 1 full" "32 0.5 half"; do
  set -- $spec
  for side in before after; do
    dir=/work/main; [ $side = before ] && dir=/tmp/before
    n=$(ls $here/panels_${3}_${side}_*.json 2>/dev/null | wc -l); i=$((n+1))
    (cd $dir && .venv/bin/python ops/bench/engine.py --systems ours-a8,ours-a8-kvbf16 --num-requests $1 \
      --scale $2 --threads 2 --out $here/panels_${3}_${side}_$i.json > $here/panels_${3}_${side}_$i.log 2>&1)
    echo "$3 $side $i $(date +%T) $(grep -E '^ours' $here/panels_${3}_${side}_$i.log | tr -s ' ' | cut -d' ' -f1-3 | tr '\n' ' ')"
  done
done
