#!/bin/bash
# Alternated before/after runs, one process a run: before = a worktree of fa73215 at /tmp/before
# (with /work/main's .venv linked in), after = /work/main. ARCH=haswell emulates AVX2 on an
# AVX-512 CPU: our kernels built -march=haswell, MKL and oneDNN held to AVX2. What ran:
#   ARCH=haswell bash ab.sh single; ARCH=haswell bash ab.sh engine ours-a8   # ab_avx2.txt
#   bash ab.sh single; bash ab.sh engine ours-a8,ours-a8-kvbf16               # ab_native.txt
# single: single_stream.py gguf+a8, two pairs; engine: engine.py SYSTEMS full, half, full, half.
# QUANT=gguf (2026-12-07, kmajor-avx2-1207) runs single with the default's exact x instead; ROUNDS=1
# runs engine's full and half once each.
mode=$1 systems=$2 arch=${ARCH:-native} tag=${ARCH:-native} quant=${QUANT:-gguf+a8}
if [ "$arch" = haswell ]; then
  export PATERNOSTER_CPU_ARCH=haswell MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
  tag=avx2
fi
# OUT=DIR (absolute): the logs go there instead (ops/bench/results/avx2-sums-1207 ran it so, 2026-12-07,
# with /tmp/before a worktree of fce8381: OUT=... ARCH=haswell bash ab.sh engine ours-a8-kvbf16).
here=${OUT:-$(cd "$(dirname "$0")" && pwd)}
run() {  # side, name, command...
  local side=$1 name=$2; shift 2
  local dir=/work/main; [ $side = before ] && dir=/tmp/before
  (cd $dir && "$@" > $here/$name.log 2>&1)
}
if [ "$mode" = single ]; then
  for i in 1 2; do
    for side in before after; do
      name=${tag}_single_${side}_$i
      run $side $name .venv/bin/python ops/bench/single_stream.py --quantization $quant \
        --prompt-tokens 32 --tokens 128 --no-hf --repeats 3 --threads 2
      echo "single $side $i $(date +%T) $(grep -E '^ours' $here/$name.log)"
    done
  done
else
  specs=("64 1 full" "32 0.5 half" "64 1 full" "32 0.5 half")
  for spec in "${specs[@]:0:$((2 * ${ROUNDS:-2}))}"; do
    set -- $spec
    for side in before after; do
      # the next number after the highest there (a count reused a number once some were moved away)
      n=$(ls $here/${tag}_engine_${3}_${side}_*.json 2>/dev/null | sed 's/.*_\([0-9]*\)\.json/\1/' | sort -n | tail -1)
      n=${n:-0}; name=${tag}_engine_${3}_${side}_$((n+1))
      run $side $name .venv/bin/python ops/bench/engine.py --systems $systems --num-requests $1 \
        --scale $2 --threads 2 --out $here/$name.json
      echo "$3 $side $((n+1)) $(date +%T) $(grep -E '^ours' $here/$name.log | tr -s ' ' | cut -d' ' -f1-3 | tr '\n' ' ')"
    done
  done
fi
