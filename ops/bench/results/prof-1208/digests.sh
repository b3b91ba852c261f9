# Output digests of ours (SYS=ours or ours-a8) before (/tmp/before, a worktree of 98459d8) and after, both mixes.
for spec in "32 0.5" "64 1"; do
  for tree in /tmp/before /work/main; do
    echo "## $tree --num-requests ${spec% *} --scale ${spec#* }"
    (cd $tree && .venv/bin/python /work/main/ops/bench/results/amx-panels-1207/digest.py --systems $SYS \
      --num-requests ${spec% *} --scale ${spec#* } --threads 2 2>&1 | grep -E '^(OUTPUT_DIGEST|ours )')
  done
done
