#!/usr/bin/env bash
# Installs the compilers that the compile gates (`python -m dsa_ops gates`) need and the machine lacks:
#   - clang-22, lld-22 and libamdhip64-dev from Debian (gfx950 ISA for backends_rocm/kernels/*.hip)
#   - nvcc 13.5 from PyPI into $DSA_TOOLCHAINS/nvcc-13.5 (sm_100a / sm_107a; the machine's nvcc is 13.0)
# Idempotent: each step is skipped when its result is already there. pip's cache is used, so a
# re-install after `rm -rf .toolchains` only unpacks. Prints how long each step took.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
toolchains="${DSA_TOOLCHAINS:-$repo/.toolchains}"
# Keep these pins in step with NVCC_135_PINS in ops_core/gates.py (which checks the stamp file).
nvcc_pins="nvidia-cuda-nvcc==13.5.37 nvidia-nvvm==13.5.37 nvidia-cuda-crt==13.5.37 nvidia-cuda-runtime==13.5.37"
nvcc_dir="$toolchains/nvcc-13.5"
nvcc_bin="$nvcc_dir/nvidia/cu13/bin/nvcc"

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
step_time() { local ms=$(( $(now_ms) - $2 )); printf '[install_toolchains] %-26s %d.%01d s\n' "$1" $((ms / 1000)) $((ms % 1000 / 100)); }
t_all=$(now_ms)

# --- 1. clang-22 / lld-22 / HIP headers ------------------------------------------------------------
t=$(now_ms)
if command -v clang++-22 >/dev/null && command -v ld.lld-22 >/dev/null && [ -e /usr/include/hip/hip_runtime.h ]; then
  echo "[install_toolchains] clang++-22, ld.lld-22 and HIP headers present: apt step skipped"
else
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends clang-22 lld-22 libamdhip64-dev >/dev/null
  step_time "apt clang-22 lld-22 hip" "$t"
fi

# --- 2. nvcc 13.5 from PyPI -------------------------------------------------------------------------
# `pip install --target` rather than a venv: nothing here is imported, we only need the files, and a
# target dir is one self-contained folder. The wheels are kept in our own wheelhouse because pip's
# HTTP cache stores nothing here (the registry proxy sends no caching headers), so a reinstall after a
# pin change or `rm -rf $DSA_TOOLCHAINS/nvcc-13.5` only unpacks. The stamp records the pins.
t=$(now_ms)
stamp="$nvcc_dir/.dsa-pins"
wheels="$toolchains/wheels"
if [ -x "$nvcc_bin" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$nvcc_pins" ]; then
  echo "[install_toolchains] nvcc 13.5 present at $nvcc_bin: pip step skipped"
else
  rm -rf "$nvcc_dir"
  mkdir -p "$wheels"
  pip=(python3 -m pip --disable-pip-version-check)
  # --no-deps: the four wheels are the whole toolchain we need; nothing else gets pulled in.
  missing=()
  for pin in $nvcc_pins; do  # wheel files are named with underscores: nvidia_cuda_nvcc-13.5.37-...whl
    name="${pin%%==*}"; ver="${pin##*==}"
    compgen -G "$wheels/${name//-/_}-$ver-*.whl" >/dev/null || missing+=("$pin")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    "${pip[@]}" download --quiet --no-deps --dest "$wheels" "${missing[@]}"
  fi
  "${pip[@]}" install --quiet --no-deps --no-index --find-links "$wheels" --root-user-action=ignore \
    --target "$nvcc_dir" $nvcc_pins
  echo "$nvcc_pins" > "$stamp"
  step_time "pip nvcc 13.5" "$t"
fi

# --- 3. verify ---------------------------------------------------------------------------------------
"$nvcc_bin" --version | tail -n 2
# nvcc must find its cicc next to it (nvidia/cu13/nvvm/bin); a tiny device compile proves the pieces fit.
probe="$(mktemp -d)"
trap 'rm -rf "$probe"' EXIT
printf '__global__ void k(int* p) { p[threadIdx.x] = 1; }\n' > "$probe/p.cu"
for arch in 100a 107a; do
  "$nvcc_bin" -c -o "$probe/p.o" "-gencode=arch=compute_$arch,code=sm_$arch" "$probe/p.cu"
done
echo "[install_toolchains] nvcc 13.5 sm_100a/sm_107a probe compiles OK; sm_10x codes: $("$nvcc_bin" --list-gpu-code | grep -E '^sm_10' | tr '\n' ' ')"
clang++-22 --version | head -n 1
echo "[install_toolchains] sizes: nvcc 13.5 $(du -sh "$nvcc_dir" | cut -f1), wheelhouse $(du -sh "$wheels" 2>/dev/null | cut -f1)"
step_time "total" "$t_all"
