"""Shared by the CPU gates of the C++ CUDA-key kernels (tests/test_{mla,sa,paged}_route_gate_cpu.py): each builds one
route file (backends_cuda/csrc/<op>_route.cpp) for the CPU key of copies of the op, in namespaces of its own, with a
stub binding entry that raises STUB_LAUNCH, and compares, call by call, whether the C++ fast check served a call
(the marker) or handed it to the router with the Python path's decision. The script runs in a fresh interpreter.
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

# The script's start: build_route(op, route_file, macro, stub) -> (the op's copy in the CPU key's namespace, its
# route_set); route(fn) -> "served" | "router" | "no error"; with_(case, **kw): a copy of a case dict, kw replaced.
PRELUDE = textwrap.dedent(
    r"""
    import json, os, tempfile
    import torch
    from torch.utils import cpp_extension
    import dsa_ops
    from dsa_ops._checks import DsaArgumentError
    from dsa_ops._define import OPS

    def build_route(op, route_file, macro, stub):
        d = OPS[op]
        ns = "dsa_gate_" + macro.lower()
        libs = [torch.library.Library(ns, "DEF"), torch.library.Library(ns + "_route", "DEF")]
        forms = [(op, d.schema)] + ([(op + ".out", d.out.schema)] if d.out is not None else [])

        def router(*args, **kwargs):
            raise RuntimeError("ROUTER")

        for lib in libs:
            for name, schema in forms:
                lib.define(name + schema)
        for name, _ in forms:
            libs[1].impl(name, router, "CPU")
        csrc = os.path.join(ROOT, "backends_cuda", "csrc")
        build = tempfile.mkdtemp(prefix=ns + "_")
        with open(os.path.join(build, "stub.cpp"), "w") as f:
            f.write('#include <torch/headeronly/util/Exception.h>\n' + stub)
        m = "-DDSA_" + macro + "_ROUTE_"
        flags = ["-O1", "-DTORCH_TARGET_VERSION=0x020b000000000000", m + "CPU_TEST", m + "NS=" + ns, m + "KEY=CPU",
                 m + "FALLBACK_NS=" + ns + "_route", m + "CONTROL_NS=" + ns + "_ctl"]
        cpp_extension.load(name=ns, sources=[os.path.join(csrc, route_file), os.path.join(build, "stub.cpp")],
                           build_directory=build, is_python_module=False, extra_cflags=flags,
                           extra_include_paths=[csrc, os.path.join(ROOT, "backends_cuda", "include")], verbose=False)
        route_set = getattr(getattr(torch.ops, ns + "_ctl"), op + "_route_set")
        route_set(1)
        return getattr(torch.ops, ns), route_set, libs

    def with_(case, **kw):
        case = dict(case)
        case.update(kw)
        return case

    def route(fn):
        try:
            fn()
            return "no error"
        except Exception as e:  # noqa: BLE001
            return "served" if "STUB_LAUNCH" in str(e) else "router"
    """
).replace("ROOT", repr(ROOT))


def run_gate(script: str, tmp_path_factory) -> dict:
    """Run PRELUDE + `script`, which prints "RESULTS " + json of {case: [route result, python serves]}."""
    if shutil.which("c++") is None:
        pytest.skip("needs a host C++ compiler (c++) to build a route file for the CPU key")
    env = dict(os.environ, HOME=str(tmp_path_factory.mktemp("home")))
    p = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(script)], env=env, capture_output=True,
                       text=True, timeout=900)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULTS ")]
    assert p.returncode == 0 and lines, f"route build or run failed (exit {p.returncode}):\n{p.stdout}{p.stderr}"
    return json.loads(lines[-1][len("RESULTS "):])


def check_agreement(gate: dict, served: list, stricter: tuple = ()) -> None:
    """Every call the C++ check served the Python path launches too, the two differ only on `stricter` (calls
    the C++ check leaves to the router), the `served` calls are served, and a zero mask ("mask-off") routes."""
    wrong = {name: r for name, r in gate.items() if r[0] == "served" and not r[1]}
    assert not wrong, f"the C++ check serves calls the Python path declines: {wrong}"
    assert all(r[0] in ("served", "router") for r in gate.values()), gate
    differ = sorted(name for name, r in gate.items() if (r[0] == "served") != r[1] and name != "mask-off")
    assert differ == sorted(stricter), gate
    assert {name: gate[name] for name in served} == {name: ["served", True] for name in served}
    assert gate["mask-off"][0] == "router"
