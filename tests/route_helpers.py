"""Shared by the tests of the C++ CUDA-key kernels (tests/test_gpu_*_route.py): which Python router code ran."""

from __future__ import annotations

import sys


def python_calls(fn) -> list[str]:
    """Names of the dsa router code objects (the generated `<dsa::op impl>` functions and registry.py)
    that run during fn()."""
    seen = []

    def prof(frame, event, arg):
        f = frame.f_code.co_filename
        if event == "call" and (f.startswith("<dsa::") or f.endswith("registry.py")):
            seen.append(f"{f}:{frame.f_code.co_name}")

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def replayed(fn):
    """fn() captured in a CUDA graph (benchmarks/harness.py's capture_graph: a warm-up call on a side stream first),
    its outputs NaN-filled, the graph replayed: the replay's outputs (a tensor or a tuple, as fn returns)."""
    import importlib.util
    import pathlib

    import torch

    path = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "harness.py"
    spec = importlib.util.spec_from_file_location("bench_harness", path)
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    calls = []
    g = harness.capture_graph(lambda: calls.append(fn()))
    outs = calls[-1]  # the captured call's
    for t in outs if isinstance(outs, tuple) else (outs,):
        t.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    return outs
