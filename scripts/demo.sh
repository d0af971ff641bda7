#!/usr/bin/env bash
# The main job (README): sets up dsa-ops, then runs one DSA decode layer step on synthetic long-context data
# on the best available device (the GPU when there is one, the exact CPU reference otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
exec ${PYTHON:-python3} -m dsa_ops demo "$@"
