#!/bin/bash
# Alternated before/after runs of huge-pages-1206/steps_probe.py, the default system: full scale,
# half, full, half, full. $1 names the runs' files: "bal" (before = a worktree of 99b6ba9 at
# /tmp/before, balance change only) and "both" (before = 88dcc7b, both changes), each run as
# `bash ab_pairs.sh bal` then `bash ab_pairs.sh both`.
prefix=${1:?name the runs: bal or both}
for spec in "64 1 full" "32 0.5 half" "64 1 full" "32 0.5 half" "64 1 full"; do
  set -- $spec
  for side in before after; do
    dir=/work/main; [ $side = before ] && dir=/tmp/before
    n=$(ls /tmp/probe/${prefix}_${3}_${side}_*.json 2>/dev/null | grep -v out | wc -l); i=$((n+1))
    out=/tmp/probe/${prefix}_${3}_${side}_$i
    (cd $dir && .venv/bin/python /tmp/probe/steps_probe.py $out.json --systems ours --num-requests $1 --scale $2 --threads 2 --out $out.out.json > $out.log 2>&1)
    echo "$3 $side $i done $(date +%T)"
  done
done
