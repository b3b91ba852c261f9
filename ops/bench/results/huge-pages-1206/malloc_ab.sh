#!/bin/bash
cd /work/main
for i in 1 2; do
  for side in plain tuned; do
    if [ $side = tuned ]; then export GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296; else unset GLIBC_TUNABLES; fi
    .venv/bin/python /tmp/probe/steps_probe.py /tmp/probe/malloc_${side}_$i.json --systems ours --num-requests 64 --scale 1 --threads 2 --out /tmp/probe/malloc_${side}_$i.out.json > /tmp/probe/malloc_${side}_$i.log 2>&1
    echo "$side $i $(date +%T)"
  done
done
