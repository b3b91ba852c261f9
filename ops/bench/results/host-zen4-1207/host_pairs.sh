for i in 1 2 3; do
  for side in before after; do
    root=/work/main; [ $side = before ] && root=/tmp/before
    (cd $root && /work/main/.venv/bin/python ops/bench/host_overhead.py --batches 64 256 --steps 60 --clock thread --coarse --stub-device --out /tmp/hab/${side}_$i.json > /tmp/hab/${side}_$i.log 2>&1)
  done
done
echo done > /tmp/hab/DONE
