#!/usr/bin/env bash
# Everything that needs a CUDA GPU, in one pass that fits a short lease (about 7 minutes on an H200):
#   1. the Triton kernel tests, compiled on the GPU instead of interpreted on the CPU;
#   2. ops/bench/kernels.py's full decode grid (bandwidth against the copy ceiling, SDPA);
#   3. ops/bench/engine.py on CUDA: ours against HF continuous batching on a random-weight model
#      of Llama-3.2-1B's shape (bf16), then ours alone on 4x the requests.
#
#   OUT=results/gpu TOKENIZER=dir-with-config-and-tokenizer bash ops/bench/gpu_check.sh
#
# Argument-rejection tests stay on the CPU (they pass CPU tensors on purpose).
# Each part has its own time limit and a failing part does not stop the next, so one run says as
# much as it can. Logs and JSON land in $OUT. Missing pure-Python packages (redis, pydantic, our
# transformers pin) can come as wheels in .whl/ (see the device tool's README).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-ops/bench/results/gpu}
TOKENIZER=${TOKENIZER:-.gpu/tokenizer}
MODEL_DIR=${MODEL_DIR:-/tmp/paternoster-llama-1b}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

section() { echo; echo "=== $1 ($(date +%T))"; }

section environment
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv \
    | tee "$OUT/env.txt"
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton",
triton.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name())' \
    | tee -a "$OUT/env.txt"

section "kernel tests on the GPU"
PATERNOSTER_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE \
    tests/kernels/test_triton_decode.py tests/kernels/test_triton_prefill.py \
    tests/kernels/test_triton_kv_write.py tests/kernels/test_triton_backend.py \
    tests/kernels/test_triton_sweep.py -k "not rejects" >"$OUT/kernel_tests.log" 2>&1
echo "pytest exit $?"
tail -25 "$OUT/kernel_tests.log"

section "decode kernel grid"
timeout 110 python3 ops/bench/kernels.py --out "$OUT/decode.json" >"$OUT/decode.log" 2>&1
echo "kernels.py exit $?"
tail -32 "$OUT/decode.log"

section "engine: random Llama-3.2-1B shape, bf16"
timeout 60 python3 ops/bench/random_model.py --shape llama-3.2-1b --tokenizer "$TOKENIZER" \
    --out "$MODEL_DIR" --device cuda 2>&1 | grep -v "shards"
timeout 150 python3 ops/bench/engine.py --device cuda --model "$MODEL_DIR" --threads 8 \
    --systems ours,hf-cb --keep-going --kv-cache-bytes 16e9 --max-num-seqs 256 \
    --max-num-batched-tokens 8192 --out "$OUT/engine.json" >"$OUT/engine.log" 2>&1
echo "engine.py exit $?"
tail -12 "$OUT/engine.log"
timeout 70 python3 ops/bench/engine.py --device cuda --model "$MODEL_DIR" --threads 8 \
    --systems ours --num-requests 256 --kv-cache-bytes 16e9 --max-num-seqs 256 \
    --max-num-batched-tokens 8192 --out "$OUT/engine256.json" >"$OUT/engine256.log" 2>&1
echo "engine.py (256 requests) exit $?"
tail -8 "$OUT/engine256.log"
