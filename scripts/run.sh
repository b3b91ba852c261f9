#!/usr/bin/env bash
# Set up (if needed), then run `paternoster` with the given arguments. With none: a demo that
# generates with the bundled SmolLM2-135M through one continuous batch.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate
if [ "$#" -eq 0 ]; then
    set -- generate --chat --max-tokens 48 \
        "What is the capital of France?" \
        "Write a haiku about a lift that never stops." \
        "Name three prime numbers."
fi
exec paternoster "$@"
