#!/usr/bin/env bash
# Installs dsa-ops (editable) with its test extras. On a machine with no torch it installs the CPU
# build torch==2.13.0 first, so no CUDA build of torch is ever pulled onto a CPU machine; a machine
# with torch (the GPU machine's 2.11) keeps its own.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! $PY -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "setup: no torch on a GPU machine: install a CUDA build of torch 2.11-2.14 first" >&2; exit 1
  fi
  $PY -m pip install -q "torch==2.13.0"
fi
# --no-build-isolation: setuptools is already there, and the GPU machine has no package index.
$PY -m pip install -q --no-build-isolation -e ".[test]" 2>&1 | grep -v "Running pip as the 'root' user" || true
$PY -c "import dsa_ops, torch; print('setup: dsa_ops', dsa_ops.__version__, 'on torch', torch.__version__)"
