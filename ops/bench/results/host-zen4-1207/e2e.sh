set -x
for scale in "64 1" "32 0.5"; do
  set -- $scale
  for side in before after; do
    root=/work/main; [ $side = before ] && root=/tmp/before
    (cd $root && /work/main/.venv/bin/python ops/bench/peers/run_peers.py --num-requests $1 --scale $2 --threads 2 --rounds 1 --peers "" --local ours-a8-kvbf16 --out /tmp/hab/e2e_${side}_$1.json > /tmp/hab/e2e_${side}_$1.log 2>&1)
  done
done
echo done > /tmp/hab/E2E_DONE
