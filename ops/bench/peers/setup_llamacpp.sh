#!/usr/bin/env bash
# Build .venv-llamacpp at the repository root, in two stages, each once (a stamp file each):
#
#  1. The venv with httpx (what llamacpp.py needs). With LLAMACPP_BINDINGS=1 also
#     llama-cpp-python[server] (pip compiles its vendored llama.cpp: the registry has only the
#     source; about 15 min on 2 cores). Its OpenAI server runs one request at a time (a global
#     lock, no parallel slots), so it is not the peer we measure and nothing here imports it.
#  2. llama.cpp's own `llama-server` (parallel slots, continuous batching) and `llama-quantize`,
#     built with cmake from the llama.cpp source vendored in that same sdist, into
#     .venv-llamacpp/llama-server/bin/.
#
#     bash ops/bench/peers/setup_llamacpp.sh    # later runs see the stamps and return
#
# The web UI is left out (-DLLAMA_USE_PREBUILT_UI=OFF: the default fetches it from a hub).
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${LLAMACPP_VENV:-$ROOT/.venv-llamacpp}"
PYTHON="${PYTHON:-python3}"
JOBS="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
STAMP_PY="$VENV/.paternoster-llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION"
STAMP_SERVER="$VENV/.paternoster-llama-server-$LLAMA_CPP_PYTHON_VERSION"

if [[ ! -f "$STAMP_PY" ]]; then
    start=$(date +%s)
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet httpx
    if [[ "${LLAMACPP_BINDINGS:-0}" == 1 ]]; then
        # Native build (this CPU's SIMD), no BLAS: llama.cpp's own kernels.
        CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON}" \
            "$VENV/bin/pip" install --verbose "llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION"
        "$VENV/bin/python" -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__)"
        echo "llama-cpp-python built in $(( $(date +%s) - start )) s"
    fi
    touch "$STAMP_PY"
fi

if [[ ! -f "$STAMP_SERVER" ]]; then
    start=$(date +%s)
    src="$VENV/src"
    rm -rf "$src" && mkdir -p "$src"
    "$VENV/bin/pip" download --quiet --no-deps --no-binary :all: -d "$src" \
        "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    tar -xzf "$src"/llama_cpp_python-*.tar.gz -C "$src"
    llama="$(echo "$src"/llama_cpp_python-*/vendor/llama.cpp)"
    cmake -S "$llama" -B "$VENV/llama-server" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
    # llama-quantize too: it turns the bundled Q4_1 GGUF into an F32 one (run_peers.py does).
    cmake --build "$VENV/llama-server" --target llama-server llama-quantize -j "$JOBS"
    "$VENV/llama-server/bin/llama-server" --version
    echo "llama-server built in $(( $(date +%s) - start )) s"
    touch "$STAMP_SERVER"
fi
# LLAMACPP_AVX2=1: also llama-server built for AVX2 alone (no AVX-512) into
# .venv-llamacpp/llama-server-avx2/, to set beside our -march=haswell build on an AVX-512 CPU
# (llamacpp.py --server; 366 s on a 2-core Zen 5, 2026-12-07).
STAMP_AVX2="$VENV/.paternoster-llama-server-avx2-$LLAMA_CPP_PYTHON_VERSION"
if [[ "${LLAMACPP_AVX2:-0}" == 1 && ! -f "$STAMP_AVX2" ]]; then
    start=$(date +%s)
    llama="$(echo "$VENV"/src/llama_cpp_python-*/vendor/llama.cpp)"
    cmake -S "$llama" -B "$VENV/llama-server-avx2" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
        -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
        -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TOOLS=ON \
        -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
    cmake --build "$VENV/llama-server-avx2" --target llama-server -j "$JOBS"
    echo "llama-server (AVX2) built in $(( $(date +%s) - start )) s"
    touch "$STAMP_AVX2"
fi
echo "$(du -sh "$VENV" | cut -f1) in $VENV"
