#!/bin/bash
# Single stream of the default (the file's Q4_1 blocks, x exact), before (a worktree of da498c1 at
# /tmp/before, /work/main's .venv linked in) and after (/work/main), alternated, one process a
# run: bash single.sh > single.txt
here=$(cd "$(dirname "$0")" && pwd)
for i in 1 2; do
  for threads in 1 2; do
    for side in before after; do
      dir=/work/main; [ $side = before ] && dir=/tmp/before
      name=single_t${threads}_${side}_$i
      (cd $dir && .venv/bin/python ops/bench/single_stream.py --quantization gguf \
        --prompt-tokens 32 --tokens 128 --no-hf --repeats 3 --threads $threads > $here/$name.log 2>&1)
      echo "threads $threads $side $i $(date +%T) $(grep -E '^ours' $here/$name.log | tr -s ' ')"
    done
  done
done
