#!/usr/bin/env bash
# Installs the compilers that the compile gates (`python -m dsa_ops gates`) need and the machine lacks:
#   - clang-22, lld-22 and libamdhip64-dev from Debian (gfx950 ISA for backends_rocm/kernels/*.hip)
#   - nvcc 13.5 from PyPI into $DSA_TOOLCHAINS/nvcc-13.5 (sm_100a / sm_107a; the machine's nvcc is 13.0)
#   - nvcc 13.0 the same way, only where the machine has no /usr/local/cuda-13.0 (sm_90a)
# Idempotent: each step is skipped when its result is already there; downloaded wheels are kept in
# $DSA_TOOLCHAINS/wheels, so a reinstall only unpacks. Prints how long each step took.
# Environment: DSA_TOOLCHAINS (default <repo>/.toolchains, git-ignored), DSA_SYSTEM_NVCC_130.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
toolchains="${DSA_TOOLCHAINS:-$repo/.toolchains}"
wheels="$toolchains/wheels"
# nvidia-cuda-cccl (CCCL, versioned on its own: 13.3.5.0.6 is CCCL 3.5.0) carries <nv/target> and the
# rest of libcu++, which cuda_fp16.h / cuda_bf16.h include; nvcc.profile adds its include/cccl itself.
nvcc135_pins="nvidia-cuda-nvcc==13.5.37 nvidia-nvvm==13.5.37 nvidia-cuda-crt==13.5.37 nvidia-cuda-runtime==13.5.37 nvidia-cuda-cccl==13.3.5.0.6"
# Only used where the machine has no /usr/local/cuda-13.0 (our CPU machines and CI have one).
nvcc130_pins="nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85"
system_nvcc130="${DSA_SYSTEM_NVCC_130:-/usr/local/cuda-13.0/bin/nvcc}"

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
  # No recommends: llvm-22-dev, clang-tools-22 and friends are not needed for -S to gfx950.
  $sudo apt-get install -y -qq --no-install-recommends clang-22 lld-22 libamdhip64-dev >/dev/null
  step_time "apt clang-22 lld-22 hip" "$t"
fi

# --- 2. nvcc from PyPI ------------------------------------------------------------------------------
# `pip install --target` rather than a venv: nothing here is imported, we only need the files, and a
# target dir is one self-contained folder. The wheels are kept in our own wheelhouse because pip's
# HTTP cache stores nothing here (the registry proxy sends no caching headers), so a reinstall after
# `rm -rf $DSA_TOOLCHAINS/nvcc-*` only unpacks. A stamp records the pins: changing them reinstalls.
install_nvcc() {  # install_nvcc VERSION "PINS"
  local dir="$toolchains/nvcc-$1" pins="$2" t; t=$(now_ms)
  local bin="$dir/nvidia/cu13/bin/nvcc"
  if [ -x "$bin" ] && [ "$(cat "$dir/.dsa-pins" 2>/dev/null)" = "$pins" ]; then
    echo "[install_toolchains] nvcc $1 present at $bin: pip step skipped"
    return
  fi
  rm -rf "$dir"
  mkdir -p "$wheels"
  local pip=(python3 -m pip --disable-pip-version-check) missing=() pin name ver
  for pin in $pins; do  # wheel files are named with underscores: nvidia_cuda_nvcc-13.5.37-...whl
    name="${pin%%==*}"; ver="${pin##*==}"
    compgen -G "$wheels/${name//-/_}-$ver-*.whl" >/dev/null || missing+=("$pin")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    # --no-deps: these wheels are the whole toolchain we need; nothing else gets pulled in.
    "${pip[@]}" download --quiet --no-deps --dest "$wheels" "${missing[@]}"
  fi
  # shellcheck disable=SC2086  # the pins are meant to split
  "${pip[@]}" install --quiet --no-deps --no-index --find-links "$wheels" --root-user-action=ignore \
    --target "$dir" $pins
  echo "$pins" > "$dir/.dsa-pins"
  installed=1
  step_time "pip nvcc $1" "$t"
}
installed=0

install_nvcc 13.5 "$nvcc135_pins"
nvcc135="$toolchains/nvcc-13.5/nvidia/cu13/bin/nvcc"
if [ -x "$system_nvcc130" ]; then
  echo "[install_toolchains] nvcc 13.0 present at $system_nvcc130"
else
  install_nvcc 13.0 "$nvcc130_pins"
fi

# --- 3. verify ---------------------------------------------------------------------------------------
"$nvcc135" --version | tail -n 1
clang++-22 --version | head -n 1
if [ "$installed" = 1 ] || [ "${1:-}" = "--verify" ]; then
  # nvcc must find its cicc (nvidia/cu13/nvvm/bin) and CCCL (include/cccl): a tiny device compile that
  # includes cuda_bf16.h proves the pieces fit, for both Blackwell targets of the gates.
  probe="$(mktemp -d)"
  trap 'rm -rf "$probe"' EXIT
  printf '#include <cuda_bf16.h>\n__global__ void k(__nv_bfloat16* p) { p[threadIdx.x] = __float2bfloat16(1.f); }\n' > "$probe/p.cu"
  for arch in 100a 107a; do
    "$nvcc135" -c -o "$probe/p.o" "-gencode=arch=compute_$arch,code=sm_$arch" "$probe/p.cu"
  done
  echo "[install_toolchains] nvcc 13.5 sm_100a/sm_107a probe compiles OK; sm_10x codes: $("$nvcc135" --list-gpu-code | grep -E '^sm_10' | tr '\n' ' ')"
fi
echo "[install_toolchains] size on disk: $(du -sh "$toolchains"/nvcc-* "$wheels" 2>/dev/null | awk '{printf "%s %s  ", $2, $1}')"
step_time "total" "$t_all"
