#!/bin/bash
for spec in "64 1 full" "32 0.5 half" "64 1 full" "32 0.5 half" "64 1 full"; do
  set -- $spec
  for side in before after; do
    dir=/work/main; [ $side = before ] && dir=/tmp/before
    n=$(ls /tmp/probe/both_${3}_${side}_*.json 2>/dev/null | grep -v out | wc -l); i=$((n+1))
    (cd $dir && .venv/bin/python /tmp/probe/steps_probe.py /tmp/probe/both_${3}_${side}_$i.json --systems ours --num-requests $1 --scale $2 --threads 2 --out /tmp/probe/both_${3}_${side}_$i.out.json > /tmp/probe/both_${3}_${side}_$i.log 2>&1)
    echo "$3 $side $i done $(date +%T)"
  done
done
