#!/usr/bin/env bash
# The default mix, open loop, through every system's serving path, one after another in one run:
# ours (load.py: Redis, `paternoster worker`), vLLM's OpenAI server and llama.cpp's llama-server
# (serve_load.py), then the side-by-side table (compare_serving.py).
#
#     REDIS_URL=redis://127.0.0.1:6379/0 bash ops/bench/peers/run_serving.sh
#
# RATES (default 0.4,1), NUM_JOBS (40), SEED (0), THREADS (all cores) and OUT
# (ops/bench/results/serving) override the defaults. A peer whose venv is missing is skipped.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
RATES="${RATES:-0.4,1}"
NUM_JOBS="${NUM_JOBS:-40}"
SEED="${SEED:-0}"
THREADS="${THREADS:-$(nproc)}"
OUT="${OUT:-ops/bench/results/serving}"
common=(--rates "$RATES" --num-jobs "$NUM_JOBS" --seed "$SEED" --threads "$THREADS")

"$PY" ops/bench/load.py "${common[@]}" --out-dir "$OUT/ours"
reports=("ours=$OUT/ours/report.json")
for server in vllm llama.cpp; do
    extra=()
    [[ "$server" == vllm ]] && extra=(--vllm-compile)  # vLLM's fastest configuration offline
    if "$PY" ops/bench/peers/serve_load.py --server "$server" "${common[@]}" "${extra[@]}" \
        --out-dir "$OUT/$server"; then
        reports+=("$server=$OUT/$server/report.json")
    else
        echo "$server: skipped (see above)" >&2
    fi
done
"$PY" ops/bench/peers/compare_serving.py "${reports[@]}" --out "$OUT/serving.json" \
    --plot-dir "$OUT"
