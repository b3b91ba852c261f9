#!/bin/bash
# Alternated before/after runs of ops/bench/engine.py, SYSTEMS in one process a side: full
# scale, half, full, half. Before = a worktree of the named revision at /tmp/before (with
# /work/main's .venv linked in), after = /work/main. Files land here as PREFIX_{full,half}_*.
#   bash ab_pairs.sh engine ours-kvbf16,ours-a8-kvbf16   # before: 7a5677b (float32 kernel
#                                                          # widening the bf16 cache)
#   bash ab_pairs.sh panels ours-a8,ours-a8-kvbf16       # before: 410c218 (each panel
#                                                          # transposed per call)
# Output: ab_engine.txt and ab_panels.txt.
prefix=$1 systems=$2
here=$(cd "$(dirname "$0")" && pwd)
for spec in "64 1 full" "32 0.5 half" "64 1 full" "32 0.5 half"; do
  set -- $spec
  for side in before after; do
    dir=/work/main; [ $side = before ] && dir=/tmp/before
    n=$(ls $here/${prefix}_${3}_${side}_*.json 2>/dev/null | wc -l); i=$((n+1))
    (cd $dir && .venv/bin/python ops/bench/engine.py --systems $systems --num-requests $1 \
      --scale $2 --threads 2 --out $here/${prefix}_${3}_${side}_$i.json > $here/${prefix}_${3}_${side}_$i.log 2>&1)
    echo "$3 $side $i $(date +%T) $(grep -E '^ours' $here/${prefix}_${3}_${side}_$i.log | tr -s ' ' | cut -d' ' -f1-3 | tr '\n' ' ')"
  done
done
