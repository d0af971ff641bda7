"""The CUDA top-k launch heuristics (backends_cuda/include/dsa_cuda/sm90_topk_heuristics.cuh), compiled
with the host C++ compiler and run on the CPU: the cluster sizes the H200 measurements chose (notes in the
header) and the DSA_OPS_TOPK_CLUSTER override."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEADER_DIR = ROOT / "backends_cuda" / "include"
CXX = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")

PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include "dsa_cuda/sm90_topk_heuristics.cuh"
// argv[1..8]: the device's active clusters of 1..8 CTAs (active[0] = 0).
int main(int argc, char** argv) {
  using namespace dsa_cuda::topk_heuristics;
  int active[kMaxCluster + 1] = {};
  for (int c = 1; c <= kMaxCluster && c < argc; ++c) {
    active[c] = std::atoi(argv[c]);
  }
  const long long shapes[][2] = {{1, 131072}, {20, 134868}, {64, 131072}, {64, 1048576}, {256, 131072},
                                 {4096, 32768}, {1, 4096}, {3, 40000}, {1, 20000}, {40, 131072}, {1, 65536},
                                 {8, 262144}, {17, 262144}};
  for (const auto& s : shapes) {
    const int c = cluster_size(s[0], s[1], 2048, 132);
    std::printf("%lld %lld %d %d\n", s[0], s[1], c, filter_cluster_size(s[0], c, active));
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    if CXX is None:
        pytest.fail("no host C++ compiler (g++, c++ or clang++) on PATH")
    d = tmp_path_factory.mktemp("heuristics")
    (d / "main.cpp").write_text(PROGRAM)
    subprocess.run([CXX, "-std=c++17", "-O1", f"-I{HEADER_DIR}", str(d / "main.cpp"), "-o", str(d / "main")],
                   check=True)
    return d / "main"


# A model of the H200 (132 SMs, one CTA of the split kernel an SM): clusters of 1..8 CTAs it runs at
# once, GPCs holding whole clusters (20 clusters of 6 did not all run at once there: see the header).
H200_LIKE = (132, 66, 44, 32, 24, 18, 16, 16)


def run(binary, env_cluster=None, active=H200_LIKE):
    env = {k: v for k, v in os.environ.items() if k != "DSA_OPS_TOPK_CLUSTER"}
    if env_cluster is not None:
        env["DSA_OPS_TOPK_CLUSTER"] = env_cluster
    out = subprocess.run([str(binary), *map(str, active)], env=env, check=True, capture_output=True,
                         text=True).stdout
    return {(int(r), int(w)): (int(c), int(f)) for r, w, c, f in (line.split() for line in out.splitlines())}


def test_filter_kernel_cluster_sizes(binary):
    got = run(binary)
    # (rows, width): CTAs per row of the filter kernel (deterministic=False), at most one CTA per SM of
    # 132, parts of at least 8192 keys, the largest size of which every row's cluster runs at once
    # (20 rows: 6 CTAs a row would fit the SMs, but only 18 clusters of 6 run at once: 5).
    want = {(1, 131072): 8, (20, 134868): 5, (64, 131072): 2, (64, 1048576): 2, (256, 131072): 1,
            (4096, 32768): 1, (1, 4096): 1, (3, 40000): 4, (1, 20000): 2, (40, 131072): 3, (1, 65536): 8,
            (8, 262144): 8, (17, 262144): 6}
    assert {s: f for s, (_, f) in got.items()} == want
    # The ordered kernel (deterministic=True) keeps any size up to 8.
    assert got[(20, 134868)][0] == 6 and got[(3, 40000)][0] == 4 and got[(1, 131072)][0] == 8


def test_filter_kernel_without_clusters(binary):
    # A device that runs no cluster: one CTA a row; none of 8 CTAs: the next size down.
    assert all(f == 1 for _, f in run(binary, active=(132, 0, 0, 0, 0, 0, 0, 0)).values())
    got = run(binary, active=(132, 66, 44, 32, 24, 18, 16, 0))
    assert got[(1, 131072)][1] == 7 and got[(20, 134868)][1] == 5


@pytest.mark.parametrize("forced", ["1", "3", "8"])
def test_forced_size_is_taken_as_it_is(binary, forced):
    got = run(binary, forced)
    assert all(c == int(forced) and f == int(forced) for c, f in got.values())


def test_out_of_range_override_is_ignored(binary):
    assert run(binary, "9") == run(binary) == run(binary, "0")


REREAD = r"""
#include <cstdio>
#include <cstdlib>
#include "dsa_cuda/sm90_topk_heuristics.cuh"
// The overrides as first read, then after the environment changes (before and after read_overrides).
int main() {
  using namespace dsa_cuda::topk_heuristics;
  std::printf("%d %d\n", forced_cluster(), int(filter_sampling()));
  setenv("DSA_OPS_TOPK_CLUSTER", "3", 1);
  setenv("DSA_OPS_TOPK_SAMPLE", "0", 1);
  std::printf("%d %d\n", forced_cluster(), int(filter_sampling()));
  read_overrides();
  std::printf("%d %d\n", forced_cluster(), int(filter_sampling()));
  unsetenv("DSA_OPS_TOPK_CLUSTER");
  unsetenv("DSA_OPS_TOPK_SAMPLE");
  read_overrides();
  std::printf("%d %d\n", forced_cluster(), int(filter_sampling()));
  return 0;
}
"""


def test_overrides_read_at_first_use_and_when_told(tmp_path):
    # The launcher reads DSA_OPS_TOPK_CLUSTER / _SAMPLE once, not per launch; read_overrides (behind
    # torch.ops.dsa_cuda.topk_read_env) takes a change made since.
    (tmp_path / "main.cpp").write_text(REREAD)
    subprocess.run([CXX, "-std=c++17", "-O1", f"-I{HEADER_DIR}", str(tmp_path / "main.cpp"), "-o",
                    str(tmp_path / "main")], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("DSA_OPS_TOPK_CLUSTER", "DSA_OPS_TOPK_SAMPLE")}
    env["DSA_OPS_TOPK_CLUSTER"] = "2"
    out = subprocess.run([str(tmp_path / "main")], env=env, check=True, capture_output=True, text=True).stdout
    assert out.split("\n")[:4] == ["2 1", "2 1", "3 0", "0 1"]
