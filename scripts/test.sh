#!/usr/bin/env bash
# Set up (if needed), then lint, type-check and run every test, slow ones included.
# Usage: scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate
ruff check .
ruff format --check .
mypy
python -m pytest -q "$@"
