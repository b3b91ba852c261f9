for spec in "32 0.5" "64 1"; do
  for tree in /tmp/before /work/main; do
    echo "## $tree --num-requests ${spec% *} --scale ${spec#* }"
    (cd $tree && .venv/bin/python /work/main/ops/bench/results/amx-panels-1207/digest.py --systems ours \
      --num-requests ${spec% *} --scale ${spec#* } --threads 2 2>&1 | grep -E '^(OUTPUT_DIGEST|ours )')
  done
done
