#!/usr/bin/env bash
# The test command (README, and what CI runs): sets everything up on a fresh machine, then runs the
# CPU test suite (after ruff): references, opcheck, fakes, validation, registry, Inductor pass, Triton under the
# interpreter and the compile gates (sm_90a, sm_100a, sm_107a, gfx950, Triton targets).
# GPU tests are marked `gpu` and skipped where there is no GPU (benchmarks/device_run.sh runs them).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
start=$(date +%s)

bash scripts/setup.sh test
bash scripts/install_toolchains.sh

echo "== setup took $(( $(date +%s) - start )) s"
set +e
$PY -m ruff check . && $PY -m pytest -q tests "$@"
rc=$?
set -e
echo "== tests exited $rc after $(( $(date +%s) - start )) s in all"
exit $rc
