#!/usr/bin/env bash
# Set up (if needed), then run `paternoster` with the given arguments. With none: the demo, a
# worker with the bundled SmolLM2-135M and a handful of mixed jobs streamed through Redis
# (REDIS_URL when set, else an embedded redis-server).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate
if [ "$#" -eq 0 ]; then
    set -- demo
fi
exec paternoster "$@"
