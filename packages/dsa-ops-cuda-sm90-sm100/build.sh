#!/usr/bin/env bash
# Recipe skeleton: build the cuda extension ahead of time and stage it where the loader looks first.
# Run on a machine with the toolkit and a torch of the target family; then build a wheel of the repo.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-build-isolation --no-deps -e .
python3 - <<'PY'
import os, shutil
import dsa_ops.backends.cuda as be
path = be.build(verbose=True)
dest = os.path.join(os.path.dirname(be.__file__), "prebuilt")
os.makedirs(dest, exist_ok=True)
shutil.copy(path, dest)
print("staged", path, "->", dest)
PY
python3 -m pip wheel --no-build-isolation --no-deps -w dist .
