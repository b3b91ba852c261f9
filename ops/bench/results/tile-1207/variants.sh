# The AVX-512 tile with PATERNOSTER_TILE_BLOCKS / PATERNOSTER_TILE_FROM macros (an experiment copy of
# kernels/cpu_gguf_kmajor_avx512.h, /tmp/s24/avx512_tile.h; the kept header has kTileBlocks 4 and
# kTileFromRows 32 as constants). "4 100000" is no tile at all.
cd /work/main
H=kernels/cpu_gguf_kmajor_avx512.h
for v in "4 100000" "1 24" "8 24" "2 24"; do
  set -- $v
  cp /tmp/s24/avx512_tile.h $H
  sed -i "s/#define PATERNOSTER_TILE_BLOCKS 4/#define PATERNOSTER_TILE_BLOCKS $1/; s/#define PATERNOSTER_TILE_FROM 24/#define PATERNOSTER_TILE_FROM $2/" $H
  echo "== blocks $1 from $2"
  .venv/bin/python ops/bench/quant_linear.py --systems q4_1_kmajor fp32_onednn --rows 12 16 20 24 32 48 64 80 128 256 512 1024 --threads 2 --repeats 3 --out /tmp/s24/ql_b$1_f$2.json 2>&1 | grep rows
done
cp /tmp/s24/avx512_tile.h $H
echo ALLDONE
