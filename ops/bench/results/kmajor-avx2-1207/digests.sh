#!/bin/bash
# The output token digests of the default (engine.py --systems ours) before (/tmp/before, a
# worktree of 84cdde5) and after, at both scales, on the native build and on the AVX2 one.
R=$(cd "$(dirname "$0")" && pwd)
for arch in native haswell; do
  for spec in "32 0.5" "64 1"; do
    for tree in /tmp/before /work/main; do
      echo "## $arch $tree --num-requests ${spec% *} --scale ${spec#* }"
      (cd $tree && if [ $arch = haswell ]; then
         export PATERNOSTER_CPU_ARCH=haswell MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2; fi
       .venv/bin/python /work/main/ops/bench/results/amx-panels-1207/digest.py --systems ours \
         --num-requests ${spec% *} --scale ${spec#* } --threads 2 2>&1 | grep -E '^(OUTPUT_DIGEST|ours )')
    done
  done
done
