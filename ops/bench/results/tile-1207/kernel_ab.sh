# the engine's own dispatch (q4_1@float32) before and after, alternated, 2 threads
R=/work/main/ops/bench/results/tile-1207
for i in 1 2; do
 for side in before after; do
  dir=/work/main; [ $side = before ] && dir=/tmp/before
  (cd $dir && .venv/bin/python ops/bench/quant_linear.py --systems q4_1@float32 fp32_onednn --rows 16 32 48 64 80 128 256 512 1024 --threads 2 --repeats 3 --out $R/kernel_ab_${side}_$i.json 2>&1 | grep rows | sed "s/^/$side $i /")
 done
done
