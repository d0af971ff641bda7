"""smxx_fast_div.cuh's multiply-shift division (the lean MLA producer's slot -> page), compiled with the host C++
compiler and checked against n / d: every d up to 4096 and the powers of two, primes and extremes up to 2^31, each
against n = 0, 1, d - 1, d, d + 1, 2^31 - 1, multiples of d and their neighbours, and pseudo-random n below 2^31."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEADER_DIR = ROOT / "backends_cuda" / "include"
CXX = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")

PROGRAM = r"""
#include <cstdint>
#include <cstdio>
#include <vector>
#include "dsa_cuda/smxx_fast_div.cuh"
int main() {
  using namespace dsa_cuda;
  std::vector<uint32_t> ds;
  for (uint32_t d = 1; d <= 4096; ++d) ds.push_back(d);
  for (int s = 12; s <= 31; ++s) {
    const uint32_t p = uint32_t{1} << s;
    ds.push_back(p - 1); ds.push_back(p);
    if (s < 31) ds.push_back(p + 1);  // the header's range: d <= 2^31
  }
  const uint32_t extra[] = {1000003u, 16777259u, 2147483647u, 3u * 65536u + 7u, 1u << 20, (1u << 20) - 3u};
  for (uint32_t d : extra) ds.push_back(d);
  const uint32_t kMax = 0x7fffffffu;
  uint64_t x = 0x9e3779b97f4a7c15ull, checked = 0, bad = 0;
  for (uint32_t d : ds) {
    const FastDiv f = make_fast_div(d);
    std::vector<uint32_t> ns = {0u, 1u, d - 1u, d, d + 1u, kMax, kMax - 1u, kMax - d};
    for (uint64_t k = 2; k * d <= kMax && k < 64; k = k * 3 + 1) {
      ns.push_back(uint32_t(k * d)); ns.push_back(uint32_t(k * d - 1)); ns.push_back(uint32_t(k * d + 1));
    }
    for (int r = 0; r < 64; ++r) {
      x ^= x << 13; x ^= x >> 7; x ^= x << 17;
      ns.push_back(uint32_t(x) & kMax);
    }
    for (uint32_t n : ns) {
      if (n > kMax) continue;
      ++checked;
      if (fast_div_host(n, f) != n / d) {
        if (bad++ < 10) std::printf("bad %u / %u: %u\n", n, d, fast_div_host(n, f));
      }
    }
  }
  std::printf("checked %llu bad %llu\n", (unsigned long long)checked, (unsigned long long)bad);
  return bad != 0;
}
"""


def test_fast_div_matches_division(tmp_path):
    if CXX is None:
        pytest.fail("no host C++ compiler (g++, c++ or clang++) on PATH")
    (tmp_path / "main.cpp").write_text(PROGRAM)
    subprocess.run([CXX, "-std=c++17", "-O2", f"-I{HEADER_DIR}", str(tmp_path / "main.cpp"), "-o",
                    str(tmp_path / "main")], check=True)
    run = subprocess.run([str(tmp_path / "main")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout
    assert "bad 0" in run.stdout
