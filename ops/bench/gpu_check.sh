#!/usr/bin/env bash
# Everything that needs a CUDA GPU, in one unattended pass that fits a 15-minute lease:
#   1. the Triton kernel tests (the fused layer ops first), compiled on the GPU, not interpreted;
#   2. random weights in Llama-3.2-1B's and Qwen3-0.6B's shapes (bf16, SmolLM2's tokenizer);
#   3. ops/bench/engine.py on the 64-request mix: ours against HF continuous batching;
#   4. ops/bench/gpu_steps.py: ms per decode step at batch 1-256 against its byte floor (weights
#      + the K/V it reads, over a measured device copy), and the share of it the GPU sat idle;
#   5. nano-vllm's workload (256 requests, prompt and output lengths uniform in 100-1024, EOS
#      ignored): ours on both shapes (NANO_HF_CB=1 adds HF continuous batching on Llama's);
#   6. the mix at 4x the requests, ours alone; ops/bench/kernels.py's decode grid;
#   FP8 (with QUICK=1 or FP8=1): Llama-3.2-1B's shape as an FP8 checkpoint (e4m3, a scale a row),
#      its decode steps at batch 1, 32 and 256 against bf16's from (4), the same steps with
#      --quantization int8, and ops/bench/quant_gpu.py: each projection's 8-bit kernel at its
#      tile shapes against bf16's and FP8's GEMMs (issue 23);
#   7. a digest of every JSON report (ops/bench/gpu_summary.py): the tool returns only the tail.
#
#   OUT=results/gpu TOKENIZER=dir-with-config-and-tokenizer bash ops/bench/gpu_check.sh
#   SMOKE=1 OUT=/tmp/gpu-smoke TOKENIZER=dir bash ops/bench/gpu_check.sh   # CPU, tiny, ~2 min
#   QUICK=1 OUT=... bash ops/bench/gpu_check.sh   # a second lease call, ~3 min: the decode
#       kernel's tests, random weights, the decode split sweep, both shapes' decode steps, the
#       mix with ours alone, the FP8 and int8 steps (limits 45 + 35 + 35 s)
#   QUANT=1 OUT=... bash ops/bench/gpu_check.sh   # ~2.5 min: the 8-bit kernels' tests, Llama's
#       random weights, bf16's decode steps at batch 1, 32 and 256, then the FP8 part alone
#   BASE=.ab/base QUICK=1 OUT=... bash ops/bench/gpu_check.sh   # before/after on one host
#       BASE: a checkout to compare (`git worktree add .ab/base COMMIT`, `.ab` excluded and
#       carried): both shapes' decode steps run from it too, right after this tree's, into
#       steps_*_base.json. Two calls of one lease once got hosts 2x apart in speed (2026-12-04),
#       so host-bound figures compare only within a call. It adds 70 s: use it with QUICK=1.
#
# SMOKE=1 runs the same lines on the CPU at tiny sizes (shapes tiny and tiny-qwen3, a few
# requests, batch 1 and 3) and skips the two CUDA-only parts (kernel tests, decode grid), so the
# script's own plumbing is proven before a lease is spent on it.
# Time budget: each part has its own `timeout`, and a failing or killed part does not stop the
# next, so one run says as much as it can. The limits, in seconds, in the order they run:
#   environment 5 + 10 + 10, kernel tests 100 (all but the sweep), random Llama 30, random
#   Qwen3 25, decode splits 30, engine mix 130 (HF CB took 48 s on 2026-11-30 and had 63 of
#   64 done at its 55 s on 2026-12-04; it gives up itself after 85 s, so the report and ours'
#   figures are still written), steps Llama 35, nano-vllm Qwen3 50, nano-vllm Llama 45, steps
#   Qwen3 35, mix x4 30, decode grid 25 (it prints each case as it goes), the kernel sweep 35,
#   digest 5 = 600 s at worst, the 10 min a lease command may run. On 2026-12-04 the run took
#   350 s; the 133 kernel tests got through 123 in 120 s, the last 10 of the sweep cut off,
#   hence the sweep's own part at the end. Its second run that day: 430 s, the tests but the
#   sweep 84 s, the parts after the mix 21, 37, 23, 23 and 19 s. NANO_HF_CB=1 adds 120 s.
# The parts most worth their time run first. Argument-rejection tests stay on the CPU (they pass
# CPU tensors on purpose). Logs and JSON land in $OUT. Missing pure-Python packages (redis,
# pydantic, our transformers pin) can come as wheels in .whl/ (see the device tool's README).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-ops/bench/results/gpu}
TOKENIZER=${TOKENIZER:-.gpu/tokenizer}
MODEL_DIR=${MODEL_DIR:-/tmp/paternoster-llama-1b}
FP8_DIR=${FP8_DIR:-/tmp/paternoster-llama-1b-fp8}
QWEN3_DIR=${QWEN3_DIR:-/tmp/paternoster-qwen3-0.6b}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # absolute: BASE's parts run in another directory
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
SITE=${PYTHONPATH:-}  # the carried wheels, if any: BASE's parts put its tree before them
export PYTHONPATH=$PWD${SITE:+:$SITE}

section() { echo; echo "=== $1 ($(date +%T), ${SECONDS}s in)"; }
# part LIMIT LOG LINES SCRIPT ARGS...: ops/bench/SCRIPT under its own limit (seconds), its output
# in $OUT/LOG.log; then its exit status and the log's last LINES lines (the tool returns a tail).
part() {
    local limit=$1 log=$2 lines=$3 script=$4
    shift 4
    timeout "$limit" python3 "ops/bench/$script" "$@" >"$OUT/$log.log" 2>&1
    echo "$script exit $?"
    tail -"$lines" "$OUT/$log.log"
}
# KV for 256 requests of up to 2048 tokens: 115 KB a token in Qwen3-0.6B's shape (33 GB at the
# mean of 1,124 tokens), 32 KB in Llama-3.2-1B's (9 GB); the mix's 64 requests need far less.
if [ -n "${SMOKE:-}" ]; then
    DEVICE=cpu THREADS=2 LLAMA_SHAPE=tiny QWEN3_SHAPE=tiny-qwen3 WEIGHT_DTYPE=float32
    MIX_N=4 MIX4_N=8 MIX_SCALE=0.05 NANO_N=4 NANO_SCALE=0.02
    KV_MIX=64e6 KV_NANO_QWEN3=64e6 KV_NANO_LLAMA=64e6 KV_STEPS_QWEN3=64e6
    STEPS_ARGS=(--batch-sizes 1,3 --context 9 --steps 2 --warmup 1 --profile-steps 1
        --phase-steps 2 --host-profile-steps 1)
else
    DEVICE=cuda THREADS=8 LLAMA_SHAPE=llama-3.2-1b QWEN3_SHAPE=qwen3-0.6b WEIGHT_DTYPE=bfloat16
    MIX_N=64 MIX4_N=256 MIX_SCALE=1 NANO_N=256 NANO_SCALE=1
    KV_MIX=16e9 KV_NANO_QWEN3=48e9 KV_NANO_LLAMA=24e9 KV_STEPS_QWEN3=24e9
    STEPS_ARGS=()  # batch 1, 8, 32, 64, 128, 256 at 512-token prompts: gpu_steps.py's defaults
fi
# in_base CMD...: CMD in BASE's tree, its code first on the path, its C++ kernels built apart.
in_base() {
    (cd "$BASE" && export PYTHONPATH=$PWD${SITE:+:$SITE} \
        TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch-extensions}-base && "$@")
}
# steps NAME MODEL KV_BYTES: gpu_steps.py on one shape into $OUT/NAME.json; with BASE, then
# from that checkout into NAME_base.json.
steps() {
    local name=$1 model=$2 kv=$3
    part 35 "$name" 8 gpu_steps.py --device $DEVICE --model "$model" "${STEPS_ARGS[@]}" \
        --kv-cache-bytes "$kv" --out "$OUT/$name.json"
    [ -z "${BASE:-}" ] && return
    echo "--- the same from BASE ($BASE)"
    in_base part 35 "${name}_base" 8 gpu_steps.py --device $DEVICE --model "$model" \
        "${STEPS_ARGS[@]}" --kv-cache-bytes "$kv" --out "$OUT/${name}_base.json"
}
# full: true unless QUICK=1 (it guards the parts a quick run leaves out).
full() { [ -z "${QUICK:-}" ]; }
# fp8: the FP8 part runs, in a QUICK run or with FP8=1 (the full run has no time left for it).
fp8() { [ -n "${QUICK:-}" ] || [ -n "${FP8:-}" ]; }
# Ours and HF on the same requests: 256 rows a step at most, prefill chunks of 8192 tokens.
ENGINE_ARGS=(--device $DEVICE --threads $THREADS --keep-going --max-num-seqs 256
    --max-num-batched-tokens 8192)

section environment
timeout 5 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm \
    --format=csv | tee "$OUT/env.txt"
timeout 10 python3 -c 'import torch, triton, transformers; print("torch", torch.__version__,
"triton", triton.__version__, "transformers", transformers.__version__,
torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA")' | tee -a "$OUT/env.txt"
# transformers >= 5.25 imports Hugging Face's `kernels` package at module level, and ours (same
# name, first on PYTHONPATH) shadows it: every HF model class fails to import (pyproject's pin).
timeout 10 python3 -c 'import transformers.activations' 2>/dev/null \
    || echo "transformers.activations does not import: with transformers >= 5.25 our kernels" \
        "package shadows Hugging Face's; carry a transformers<5.25 wheel in .whl/" \
        | tee -a "$OUT/env.txt"

if [ $DEVICE = cpu ]; then
    # The C++ kernels build once (45 s on 2 cores) with no limit, in a directory of this run's
    # own: a build killed by a part's timeout leaves torch's lock file behind and every later
    # load waits on it for ever, and another checkout's build of the same sources (other paths)
    # would rebuild them under a part's limit.
    export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/paternoster-smoke-extensions}
    section "C++ CPU kernels"
    python3 -c 'from kernels import cpu_ops; print("cpu_ops", cpu_ops.load() is not None)'
    [ -n "${BASE:-}" ] && in_base python3 -c \
        'from kernels import cpu_ops; print("BASE cpu_ops", cpu_ops.load() is not None)'
fi

if [ $DEVICE = cuda ]; then
    KERNEL_TESTS=(tests/kernels/test_triton_layer_ops.py tests/kernels/test_gpu_kernels.py
        tests/kernels/test_triton_decode.py tests/kernels/test_quant_triton.py
        tests/kernels/test_triton_prefill.py tests/kernels/test_triton_kv_write.py
        tests/kernels/test_triton_backend.py)
    # QUICK: the decode kernel's and the quantized linears'
    full || KERNEL_TESTS=(tests/kernels/test_triton_decode.py tests/kernels/test_quant_triton.py)
    [ -n "${QUANT:-}" ] && KERNEL_TESTS=(tests/kernels/test_quant_triton.py)  # QUANT: those
    section "kernel tests on the GPU: ${#KERNEL_TESTS[@]} files"
    # compiles_for_sm90: kernels.compile_check in a subprocess, the CPU's check (CI runs it).
    PATERNOSTER_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider -rfE \
        "${KERNEL_TESTS[@]}" -k "not rejects and not compiles_for_sm90" \
        >"$OUT/kernel_tests.log" 2>&1
    echo "pytest exit $?"
    tail -25 "$OUT/kernel_tests.log"
fi

section "random weights: $LLAMA_SHAPE and $QWEN3_SHAPE shapes, $WEIGHT_DTYPE"
timeout 30 python3 ops/bench/random_model.py --shape $LLAMA_SHAPE --tokenizer "$TOKENIZER" \
    --out "$MODEL_DIR" --device $DEVICE --dtype $WEIGHT_DTYPE 2>&1 | grep -v "shards"
[ -z "${QUANT:-}" ] && timeout 25 python3 ops/bench/random_model.py --shape $QWEN3_SHAPE \
    --tokenizer "$TOKENIZER" --out "$QWEN3_DIR" --device $DEVICE --dtype $WEIGHT_DTYPE 2>&1 \
    | grep -v "shards"

# digest: every JSON report in $OUT summarised (the tool returns only the tail), and the time.
digest() {
    section "digest"
    timeout 5 python3 ops/bench/gpu_summary.py "$OUT" | tee "$OUT/summary.txt"
    echo "gpu_check.sh done in ${SECONDS}s"
}
# quant_parts: FP8's and int8's decode steps on Llama-3.2-1B's shape, and each projection's
# 8-bit kernel at its tile shapes against bf16's and FP8's GEMMs (issue 23).
quant_parts() {
    section "FP8 and int8 projections: $LLAMA_SHAPE at batch $QUANT_BATCHES (bf16's: steps_llama)"
    timeout 45 python3 ops/bench/random_model.py --shape $LLAMA_SHAPE --tokenizer "$TOKENIZER" \
        --out "$FP8_DIR" --device $DEVICE --dtype $WEIGHT_DTYPE --fp8 2>&1 | grep -v "shards"
    part 35 steps_llama_fp8 6 gpu_steps.py --device $DEVICE --model "$FP8_DIR" \
        "${STEPS_ARGS[@]}" --batch-sizes $QUANT_BATCHES --kv-cache-bytes $KV_MIX \
        --out "$OUT/steps_llama_fp8.json"
    part 35 steps_llama_int8 6 gpu_steps.py --device $DEVICE --model "$MODEL_DIR" \
        --quantization int8 "${STEPS_ARGS[@]}" --batch-sizes $QUANT_BATCHES \
        --kv-cache-bytes $KV_MIX --out "$OUT/steps_llama_int8.json"
    section "8-bit weights, one projection at a time (quant_gpu.py)"
    part 90 quant_gpu 40 quant_gpu.py ${SMOKE:+--smoke --rows 1,33} --out "$OUT/quant_gpu.json"
}
QUANT_BATCHES=1,32,256
[ -n "${SMOKE:-}" ] && QUANT_BATCHES=1,3
if [ -n "${QUANT:-}" ]; then  # QUANT=1: bf16's steps at the same batches, then quant_parts
    section "decode steps against their byte floor: Llama-3.2-1B's shape, batch $QUANT_BATCHES"
    part 35 steps_llama 6 gpu_steps.py --device $DEVICE --model "$MODEL_DIR" \
        "${STEPS_ARGS[@]}" --batch-sizes $QUANT_BATCHES --kv-cache-bytes $KV_MIX \
        --out "$OUT/steps_llama.json"
    quant_parts
    digest
    exit 0
fi

if [ $DEVICE = cuda ]; then
    # A captured graph sizes the decode kernel's grid from max_model_len (131072 for Llama's
    # shape): its split counts and shortest splits against one split, at the steps' contexts.
    section "decode splits as a CUDA graph sizes them"
    # On 2026-12-04 (contexts 528 and 1024, five variants) it took 24 s.
    part 30 splits 6 kernels.py --batches 1,8,32,64 --contexts 528,1024,4096 \
        --grid-max-len 131072 --splits 1:256,auto:64,auto:256 --out "$OUT/splits.json"
fi

MIX_SYSTEMS=ours,hf-cb
full || MIX_SYSTEMS=ours
section "engine: the 64-request mix on Llama-3.2-1B's shape, $MIX_SYSTEMS"
part 130 engine 8 engine.py --model "$MODEL_DIR" "${ENGINE_ARGS[@]}" --systems $MIX_SYSTEMS \
    --hf-cb-timeout-s 85 --num-requests $MIX_N --scale $MIX_SCALE --kv-cache-bytes $KV_MIX \
    --out "$OUT/engine.json"

section "decode steps against their byte floor: Llama-3.2-1B's shape"
steps steps_llama "$MODEL_DIR" $KV_MIX
fp8 && quant_parts

full && section "nano-vllm's workload: Qwen3-0.6B's shape, ours"
full && part 50 nano_qwen3 5 engine.py --model "$QWEN3_DIR" "${ENGINE_ARGS[@]}" --workload nano-vllm \
    --num-requests $NANO_N --scale $NANO_SCALE --systems ours --kv-cache-bytes $KV_NANO_QWEN3 \
    --out "$OUT/nano_qwen3.json"

NANO_SYSTEMS=ours NANO_LIMIT=45
[ -n "${NANO_HF_CB:-}" ] && NANO_SYSTEMS=ours,hf-cb NANO_LIMIT=175
full && section "nano-vllm's workload: Llama-3.2-1B's shape, $NANO_SYSTEMS"
full && part $NANO_LIMIT nano_llama 6 engine.py --model "$MODEL_DIR" "${ENGINE_ARGS[@]}" \
    --workload nano-vllm --num-requests $NANO_N --scale $NANO_SCALE --systems $NANO_SYSTEMS \
    --hf-cb-timeout-s 100 --kv-cache-bytes $KV_NANO_LLAMA --out "$OUT/nano_llama.json"

section "decode steps against their byte floor: Qwen3-0.6B's shape"
steps steps_qwen3 "$QWEN3_DIR" $KV_STEPS_QWEN3

full && section "engine: the mix at 256 requests, ours alone"
full && part 30 engine256 4 engine.py --model "$MODEL_DIR" "${ENGINE_ARGS[@]}" --systems ours \
    --num-requests $MIX4_N --scale $MIX_SCALE --kv-cache-bytes $KV_MIX --out "$OUT/engine256.json"

if [ $DEVICE = cuda ] && full; then
    section "decode kernel grid"
    part 25 decode 6 kernels.py --out "$OUT/decode.json"

    section "kernel tests on the GPU: the sweep"
    PATERNOSTER_TEST_DEVICE=cuda timeout 35 python3 -m pytest -q -p no:cacheprovider -rfE \
        tests/kernels/test_triton_sweep.py -k "not rejects" >"$OUT/kernel_sweep.log" 2>&1
    echo "pytest exit $?"
    tail -5 "$OUT/kernel_sweep.log"
fi

digest
