#!/usr/bin/env bash
# Installs dsa-ops (editable); `bash scripts/setup.sh test` adds the test extras. On a machine with no
# torch it installs the CPU build torch==2.13.0 first, so no CUDA build of torch is ever pulled onto a
# CPU machine; a machine with torch (the GPU machine's 2.11) keeps its own.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras=""; [ "${1:-}" = test ] && extras="[test]"
if ! $PY -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "setup: no torch on a GPU machine: install a CUDA build of torch 2.11-2.14 first" >&2; exit 1
  fi
  $PY -m pip install -q "torch==2.13.0"
fi
# --no-build-isolation: setuptools is already there (and a machine without a package index can build).
if ! $PY -m pip install -q --no-build-isolation -e ".$extras" >/tmp/dsa_ops_setup.log 2>&1; then
  # Offline machines (the lent GPU machines) have torch, triton and ninja but no index: say so, and
  # install the package alone; anything still missing fails at import below, loudly.
  echo "setup: 'pip install -e .$extras' failed (no package index?): installing dsa-ops without its dependencies" >&2
  tail -2 /tmp/dsa_ops_setup.log >&2
  $PY -m pip install -q --no-build-isolation --no-deps -e .
fi
$PY -c "import dsa_ops, torch; print('setup: dsa_ops', dsa_ops.__version__, 'on torch', torch.__version__)"
