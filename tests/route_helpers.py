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
