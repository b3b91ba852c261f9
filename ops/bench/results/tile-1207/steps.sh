# every step timed, before and after alternated, full scale
for i in 1 2; do
 for side in before after; do
  dir=/work/main; [ $side = before ] && dir=/tmp/before
  (cd $dir && .venv/bin/python /work/main/ops/bench/results/huge-pages-1206/steps_probe.py /work/main/ops/bench/results/tile-1207/steps_${side}_$i.json --systems ours --num-requests 64 --scale 1 --threads 2 > /tmp/s24/steps_${side}_$i.log 2>&1)
  echo "$side $i $(date +%T) $(grep -E '^ours ' /tmp/s24/steps_${side}_$i.log)"
 done
done
