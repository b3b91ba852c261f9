#!/bin/bash
cd /work/main
for i in 1 2; do
  for side in default active; do
    if [ $side = active ]; then export OMP_WAIT_POLICY=active; else unset OMP_WAIT_POLICY; fi
    .venv/bin/python /tmp/probe/steps_probe.py /tmp/probe/omp_${side}_$i.json --systems ours --num-requests 64 --scale 1 --threads 2 --out /tmp/probe/omp_${side}_$i.out.json > /tmp/probe/omp_${side}_$i.log 2>&1
    echo "$side $i $(date +%T)"
  done
done
