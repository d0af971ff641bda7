"""common_launch.cuh's per-device cache (`per_device`: device attributes, launch_pdl_smem's configured flag, the MLA
launcher's zero-row address), compiled with the host compiler against the CUDA headers and run on the CPU: a value
is made once a device, devices past kMaxDevices and T{} are asked again, and an error is returned, not cached."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from dsa_ops import gates

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = r"""
#include "dsa_cuda/common_launch.cuh"
#include <cstdio>
int main() {
  using dsa_cuda::per_device;
  static std::atomic<int> cache[dsa_cuda::kMaxDevices] = {};
  int calls = 0, v = 0, failed = 0;
  auto make = [&](int d, int* out) { ++calls; *out = 100 + d; return cudaSuccess; };
  auto fail = [&](int, int* out) { ++calls; *out = 7; return cudaErrorInvalidValue; };
  auto zero = [&](int, int* out) { ++calls; *out = 0; return cudaSuccess; };
  auto check = [&](bool ok, const char* what) { if (!ok) { std::printf("FAIL %s\n", what); ++failed; } };
  check(per_device(cache, 3, &v, make) == cudaSuccess && v == 103 && calls == 1, "made");
  check(per_device(cache, 3, &v, make) == cudaSuccess && v == 103 && calls == 1, "cached");
  check(per_device(cache, 4, &v, make) == cudaSuccess && v == 104 && calls == 2, "per device");
  check(per_device(cache, 64, &v, make) == cudaSuccess && v == 164 && calls == 3, "past kMaxDevices");
  check(per_device(cache, 64, &v, make) == cudaSuccess && calls == 4, "past kMaxDevices: not cached");
  check(per_device(cache, -1, &v, make) == cudaSuccess && v == 99 && calls == 5, "negative device: not cached");
  check(per_device(cache, 5, &v, fail) == cudaErrorInvalidValue && calls == 6, "error returned");
  check(per_device(cache, 5, &v, make) == cudaSuccess && v == 105 && calls == 7, "error not cached");
  check(per_device(cache, 6, &v, zero) == cudaSuccess && v == 0 && calls == 8, "T{}");
  check(per_device(cache, 6, &v, zero) == cudaSuccess && calls == 9, "T{} asked again");
  std::printf(failed ? "failed\n" : "ok\n");
  return failed ? 1 : 0;
}
"""


def _cuda_include() -> Path:
    # scripts/install_toolchains.sh's nvcc 13.5, then the system's 13.0 (the test command installs the first).
    return Path(gates.find_any_nvcc()).resolve().parent.parent / "include"


def test_per_device_cache(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    assert cxx, "no host C++ compiler (g++) on PATH"
    src, exe = tmp_path / "per_device.cpp", tmp_path / "per_device"
    src.write_text(PROGRAM)
    subprocess.run([cxx, "-std=c++17", "-Wall", "-Werror", f"-I{ROOT / 'backends_cuda' / 'include'}",
                    f"-I{_cuda_include()}", str(src), "-o", str(exe)], check=True, capture_output=True, text=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr
