#!/bin/bash
# Alternated before/after runs of the default and ours-fp32 at full scale, whose paths this change
# did not touch (the float32 cache takes the float32 kernel, whose checks and task list moved to
# cpu_prefill_tasks.h): peers_full_after.json had the default at 0.84-0.86x ours-fp32, against
# 1.23-1.39x at the session's start. Before = a worktree of adf77ec at /tmp/before.
here=$(cd "$(dirname "$0")" && pwd)
for i in 1 2; do
  for side in before after; do
    dir=/work/main; [ $side = before ] && dir=/tmp/before
    (cd $dir && .venv/bin/python ops/bench/engine.py --systems ours,ours-fp32 --num-requests 64 \
      --scale 1 --threads 2 --out $here/engine_default_${side}_$i.json > $here/engine_default_${side}_$i.log 2>&1)
    echo "full $side $i $(date +%T) $(grep -E '^ours' $here/engine_default_${side}_$i.log | tr -s ' ' | cut -d' ' -f1-3 | tr '\n' ' ')"
  done
done
