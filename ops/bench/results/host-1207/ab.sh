#!/bin/bash
# Alternated before/after runs of host_overhead.py, one process a run. "before" is a worktree
# of the last stop's head at /tmp/before (git worktree add /tmp/before 50a7896; its .venv a link
# to this checkout's). Usage: ab.sh TAG PAIRS [host_overhead.py args...]
set -u
tag=$1; pairs=$2; shift 2
out=$(cd "$(dirname "$0")" && pwd)
for i in $(seq 1 "$pairs"); do
  for side in before after; do
    dir=/work/main; [ "$side" = before ] && dir=/tmp/before
    (cd "$dir" && .venv/bin/python ops/bench/host_overhead.py --batches 64 256 "$@" \
        --out "$out/${tag}_${side}_$i.json" > /dev/null 2>&1) || echo "$side $i failed"
  done
done
