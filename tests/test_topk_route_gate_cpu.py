"""The C++ fast check of the top-k family's CUDA-key kernels (backends_cuda/csrc/topk_route.cpp), on the CPU.

The route serves a call without Python only when the Python router would accept it; anything else goes to the
router, which validates and raises. tools/host_overhead_cpu.py builds the real topk_route.cpp for the CPU key of
copies of the ops (dsa_hob::*) with a stub launch; here the stub raises a marker, so each call shows whether the
C++ check served it (the marker) or handed it to the router (the router's own error: no provider serves the CPU
there, or the argument it refuses). Runs in a fresh interpreter: the tool captures the CUDA-key routers at import.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

SCRIPT = textwrap.dedent(
    r"""
    import importlib.util, json, os, sys
    spec = importlib.util.spec_from_file_location("hoc", os.path.join(ROOT, "tools", "host_overhead_cpu.py"))
    hoc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hoc)
    import torch
    hoc.ROUTE_STUB_SRC = '''
    #include <torch/csrc/stable/tensor.h>
    #include <torch/headeronly/util/Exception.h>
    #include "topk_out.h"
    void dsa_cuda_binding::topk_launch(const TopkCall& call) { STD_TORCH_CHECK(false, "STUB_LAUNCH"); }
    '''
    libs, route_set = hoc.build_route()
    route_set(1)
    OUT = torch.ops.dsa_hob.topk_page_table_transform.out
    i32 = torch.int32
    R, W, K = 4, 50, 5
    s = torch.randn(R, W)
    pt = torch.zeros(2, 8, dtype=i32)
    L = torch.full((R,), W, dtype=i32)
    o = lambda: torch.empty(R, K, dtype=i32)
    pt_rk = torch.zeros(R, K, dtype=i32)
    buf = torch.full((R * K,), W, dtype=i32)
    meta = torch.zeros(R * K, dtype=i32)
    sf = torch.randn(R, W)
    cases = {
        "out": lambda: OUT(s, pt, L, K, out=o()),
        "out+out_raw": lambda: OUT(s, pt, L, K, out=o(), out_raw=o()),
        "out-row-strided": lambda: OUT(s, pt, L, K, out=torch.empty(R, 2 * K, dtype=i32)[:, :K]),
        "out-is-page_table": lambda: OUT(s, pt_rk, L, K, out=pt_rk),
        "out_raw-is-page_table": lambda: OUT(s, pt_rk, L, K, out=o(), out_raw=pt_rk),
        "out-over-lengths": lambda: OUT(s, pt, buf[:R], K, out=buf.view(R, K)),
        "out_raw-over-lengths": lambda: OUT(s, pt, buf[:R], K, out=o(), out_raw=buf.view(R, K)),
        "out-over-row_starts": lambda: OUT(s, pt, L, K, row_starts=meta[:R], out=meta.view(R, K)),
        "out-over-row_to_batch": lambda: OUT(s, pt, L, K, row_to_batch=meta[:R], out=meta.view(R, K)),
        "out-over-page_table_row_starts": lambda: OUT(s, pt, L, K, page_table_row_starts=meta[:R],
                                                      out=meta.view(R, K)),
        "out-over-scores": lambda: OUT(sf, pt, L, K, out=sf.view(i32)[:, :K]),
        "out_raw-over-scores": lambda: OUT(sf, pt, L, K, out=o(), out_raw=sf.view(i32)[:, :K]),
        "out-is-out_raw": lambda: (lambda b: OUT(s, pt, L, K, out=b, out_raw=b))(o()),
    }
    results = {}
    for name, fn in cases.items():
        try:
            fn()
            results[name] = "no error"
        except Exception as e:  # noqa: BLE001
            m = str(e)
            results[name] = "served" if "STUB_LAUNCH" in m else "router: " + m.splitlines()[0]
    print("RESULTS " + json.dumps(results))
    """
).replace("ROOT", repr(ROOT))

SERVED = ["out", "out+out_raw", "out-row-strided"]
OVERLAPS = {"out-is-page_table": ("out", "page_table"), "out_raw-is-page_table": ("out_raw", "page_table"),
            "out-over-lengths": ("out", "lengths"), "out_raw-over-lengths": ("out_raw", "lengths"),
            "out-over-row_starts": ("out", "row_starts"), "out-over-row_to_batch": ("out", "row_to_batch"),
            "out-over-page_table_row_starts": ("out", "page_table_row_starts"),
            "out-over-scores": ("out", "scores"), "out_raw-over-scores": ("out_raw", "scores"),
            "out-is-out_raw": ("out", "out_raw")}


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    if shutil.which("c++") is None:
        pytest.skip("needs a host C++ compiler (c++) to build topk_route.cpp for the CPU key")
    env = dict(os.environ, HOME=str(tmp_path_factory.mktemp("home")))
    p = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULTS ")]
    assert p.returncode == 0 and lines, f"route build or run failed (exit {p.returncode}):\n{p.stdout}{p.stderr}"
    return json.loads(lines[-1][len("RESULTS "):])


@pytest.mark.parametrize("case", SERVED)
def test_valid_out_buffers_are_served_by_cpp(gate, case):
    assert gate[case] == "served"


@pytest.mark.parametrize("case", sorted(OVERLAPS))
def test_out_buffers_sharing_memory_go_to_the_router(gate, case):
    out, other = OVERLAPS[case]
    assert gate[case].startswith("router: ") and f"`{out}` overlaps `{other}` in memory" in gate[case], gate[case]
