# The 4-block AVX2 tile that was tried and not kept: `patch kernels/cpu_gguf_kmajor_avx2.h <
# avx2_tile_4blocks_not_kept.patch` (the header as at 2cec753) gives the header this script times as "4".
cd /work/main
export PATERNOSTER_CPU_ARCH=haswell MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
H=kernels/cpu_gguf_kmajor_avx2.h
cp $H /tmp/s24/avx2_orig.h
for v in orig 4 orig 4; do
  if [ $v = orig ]; then cp /tmp/s24/avx2_orig.h $H; else cp /tmp/s24/avx2_new.h $H; fi
  echo "== $v $(date +%T)"
  .venv/bin/python ops/bench/quant_linear.py --avx2 --systems q4_1_kmajor_avx2 q4_1_deq fp32_onednn --rows 16 24 32 48 64 96 128 256 512 --threads 2 --repeats 3 --out /tmp/s24/ql_avx2_$v.json 2>&1 | grep rows
done
cp /tmp/s24/avx2_orig.h $H
echo ALLDONE
