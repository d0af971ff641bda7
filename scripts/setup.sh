#!/usr/bin/env bash
# Installs dsa-ops (editable); `bash scripts/setup.sh test` adds the test extras at the exact versions of
# scripts/test-constraints.txt. On a machine with no torch it installs the CPU build torch==2.13.0+cpu
# first (the local label admits no CUDA build, so none is ever pulled onto a CPU machine); a machine with
# torch (the GPU machine's 2.11) keeps its own.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras=""; constraints=()
if [ "${1:-}" = test ]; then
  extras="[test]"; constraints=(-c scripts/test-constraints.txt)
fi
pip=("$PY" -m pip --disable-pip-version-check)
if ! $PY -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "setup: no torch on a GPU machine: install a CUDA build of torch 2.11-2.14 first" >&2; exit 1
  fi
  torch_pin="torch==2.13.0+cpu"
  [ "$(uname -s)" = Linux ] || torch_pin="torch==2.13.0"  # macOS and Windows wheels are CPU builds
  if ! "${pip[@]}" install -q "$torch_pin"; then
    echo "setup: $torch_pin not found: point pip at the CPU wheels (PIP_FIND_LINKS=<folder with the" \
      "wheel> or PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu) and run again" >&2
    exit 1
  fi
fi
# --no-build-isolation needs setuptools in the environment (a Python 3.12+ venv has none); with it, a
# machine without a package index can build.
$PY -c "import setuptools" 2>/dev/null || "${pip[@]}" install -q "setuptools>=64"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! "${pip[@]}" install -q --no-build-isolation ${constraints[@]+"${constraints[@]}"} -e ".$extras" >"$log" 2>&1; then
  # Offline machines (the lent GPU machines) have torch, triton and ninja but no index: say so, and
  # install the package alone; anything still missing fails the import checks below, loudly.
  echo "setup: 'pip install -e .$extras' failed (no package index, or a pin that conflicts with the" \
    "installed torch): installing dsa-ops without its dependencies" >&2
  tail -3 "$log" >&2
  "${pip[@]}" install -q --no-build-isolation --no-deps -e .
fi
$PY -c "import dsa_ops, torch; print('setup: dsa_ops', dsa_ops.__version__, 'on torch', torch.__version__)"
if [ -n "$extras" ]; then
  # Every import of tests/ and benchmarks/ that is not the standard library or the repository's own.
  $PY -c "import hypothesis, numpy, pytest, pytest_benchmark, ruff, triton
print('setup: test tools: pytest', pytest.__version__, '/ hypothesis', hypothesis.__version__,
      '/ triton', triton.__version__, '/ numpy', numpy.__version__)"
fi
