"""The C++ fast check of dsa.paged_indexer_logits' CUDA-key kernel (backends_cuda/csrc/paged_indexer_logits_route.cpp),
on the CPU, against the Python path's decision.

The kernel may serve a call without Python only when the Python path would launch the CUDA provider: the op's
validate passes and the provider's unsupported_shape accepts it. The route file is built for the CPU key of a copy of
the op (DSA_PAGED_ROUTE_CPU_TEST, namespaces of its own) with a stub binding entry that raises a marker, so each call
shows whether the C++ check served it (the marker) or handed it to the router. Runs in a fresh interpreter.
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
    import importlib, json, os, tempfile
    import torch
    from torch.utils import cpp_extension
    import dsa_ops
    from dsa_ops._checks import DsaArgumentError
    from dsa_ops._define import OPS
    from dsa_ops.backends.cuda import providers_paged_indexer as cu
    P = importlib.import_module("dsa_ops.ops.paged_indexer_logits")

    schema = OPS["paged_indexer_logits"].schema
    defs = torch.library.Library("dsa_pagedgate", "DEF")
    routes = torch.library.Library("dsa_pagedgate_route", "DEF")
    for lib in (defs, routes):
        lib.define("paged_indexer_logits" + schema)

    def router(*args, **kwargs):
        raise RuntimeError("ROUTER")

    routes.impl("paged_indexer_logits", router, "CPU")
    csrc = os.path.join(ROOT, "backends_cuda", "csrc")
    build = tempfile.mkdtemp(prefix="paged_route_gate_")
    stub = os.path.join(build, "stub.cpp")
    with open(stub, "w") as f:
        f.write('''
    #include <torch/headeronly/util/Exception.h>
    #include "paged_indexer_logits_out.h"
    using torch::stable::Tensor;
    void dsa_cuda_binding::paged_indexer_logits_out(Tensor, Tensor, Tensor, Tensor, Tensor, int64_t, bool, bool,
                                                    int64_t, Tensor) {
      STD_TORCH_CHECK(false, "STUB_LAUNCH");
    }
    ''')
    flags = ["-O1", "-DTORCH_TARGET_VERSION=0x020b000000000000", "-DDSA_PAGED_ROUTE_CPU_TEST",
             "-DDSA_PAGED_ROUTE_NS=dsa_pagedgate", "-DDSA_PAGED_ROUTE_KEY=CPU",
             "-DDSA_PAGED_ROUTE_FALLBACK_NS=dsa_pagedgate_route", "-DDSA_PAGED_ROUTE_CONTROL_NS=dsa_pagedgate_ctl"]
    cpp_extension.load(name="dsa_paged_route_gate",
                       sources=[os.path.join(csrc, "paged_indexer_logits_route.cpp"), stub],
                       build_directory=build, is_python_module=False, extra_cflags=flags,
                       extra_include_paths=[csrc, os.path.join(ROOT, "backends_cuda", "include")], verbose=False)
    torch.ops.dsa_pagedgate_ctl.paged_indexer_logits_route_set(1)
    OP = torch.ops.dsa_pagedgate.paged_indexer_logits
    FP8, I32 = torch.float8_e4m3fn, torch.int32

    def base(b=4, next_n=1, h=64, d=128, nb=16, max_blocks=8, max_len=512):
        return dict(q=torch.zeros((b, next_n, h, d), dtype=FP8), kv=torch.empty((nb, 64, 1, d + 4), dtype=torch.uint8),
                    w=torch.zeros((b * next_n, h)), lens=torch.zeros(b, dtype=I32),
                    bt=torch.zeros((b, max_blocks), dtype=I32), max_len=max_len, precise=False)

    def with_(c, **kw):
        c = dict(c)
        c.update(kw)
        return c

    b = base()
    qbuf = torch.zeros(4 * 64 * 128 + 16, dtype=FP8)
    cases = {
        "plain": b,
        "next_n-2": base(next_n=2),
        "h32": base(h=32),
        "h32-next_n-4": base(h=32, next_n=4),
        "precise": with_(b, precise=True),
        "batch-0": base(b=0),
        "max_len-0": with_(b, max_len=0),
        "no-blocks": base(nb=0),
        "one-block": base(nb=1),
        "w-transposed": with_(b, w=torch.zeros((64, 4)).t()),
        "lens-strided": with_(b, lens=torch.zeros(8, dtype=I32)[::2]),
        "bt-strided": with_(b, bt=torch.zeros((4, 16), dtype=I32)[:, ::2]),
        "q-offset-16": with_(b, q=qbuf[16:].view(4, 1, 64, 128)),
        "q-offset-8": with_(b, q=qbuf[8:8 + 4 * 64 * 128].view(4, 1, 64, 128)),
        "q-bf16": with_(b, q=torch.zeros((4, 1, 64, 128), dtype=torch.bfloat16)),
        "q-3d": with_(b, q=torch.zeros((4, 64, 128), dtype=FP8)),
        "q-last-stride": with_(b, q=torch.zeros((4, 1, 64, 128, 2), dtype=FP8)[..., 0]),
        "h48": base(h=48),
        "d64": base(d=64),
        "kv-int8": with_(b, kv=b["kv"].view(torch.int8)),
        "kv-block-32": with_(b, kv=torch.empty((16, 32, 1, 132), dtype=torch.uint8)),
        "kv-width": with_(b, kv=torch.empty((16, 64, 1, 128), dtype=torch.uint8)),
        "kv-block-stride-8": with_(b, kv=torch.empty((16, 64 * 132 + 8), dtype=torch.uint8)[:, :64 * 132].view(
            16, 64, 1, 132)),
        "kv-block-stride-16": with_(b, kv=torch.empty((16, 64 * 132 + 16), dtype=torch.uint8)[:, :64 * 132].view(
            16, 64, 1, 132)),
        "kv-offset": with_(b, kv=torch.empty(16 * 64 * 132 + 1, dtype=torch.uint8)[1:].view(16, 64, 1, 132)),
        "w-shape": with_(b, w=torch.zeros((4, 32))),
        "w-bf16": with_(b, w=torch.zeros((4, 64), dtype=torch.bfloat16)),
        "lens-shape": with_(b, lens=torch.zeros(3, dtype=I32)),
        "lens-int64": with_(b, lens=torch.zeros(4, dtype=torch.int64)),
        "bt-rows": with_(b, bt=torch.zeros((3, 8), dtype=I32)),
        "bt-int64": with_(b, bt=torch.zeros((4, 8), dtype=torch.int64)),
        "next_n-1025": base(b=1, next_n=1025, max_len=64),
        "max_len-2^31": with_(b, max_len=2**31 - 1000),
        "max_len-negative": with_(b, max_len=-1),
    }

    def python_serves(c):
        try:
            P.validate(c["q"], c["kv"], c["w"], c["lens"], c["bt"], c["max_len"], True, c["precise"])
        except DsaArgumentError:
            return False
        return cu.unsupported_shape(c["q"], c["kv"], c["max_len"]) is None

    def route(c):
        try:
            OP(c["q"], c["kv"], c["w"], c["lens"], c["bt"], max_context_len=c["max_len"], precise=c["precise"])
            return "no error"
        except Exception as e:  # noqa: BLE001
            return "served" if "STUB_LAUNCH" in str(e) else "router"

    results = {name: [route(c), python_serves(c)] for name, c in cases.items()}
    torch.ops.dsa_pagedgate_ctl.paged_indexer_logits_route_set(0)
    results["mask-off"] = [route(b), True]
    print("RESULTS " + json.dumps(results))
    """
).replace("ROOT", repr(ROOT))

SERVED = ["plain", "next_n-2", "h32", "h32-next_n-4", "precise", "batch-0", "max_len-0", "no-blocks", "one-block",
          "w-transposed", "lens-strided", "bt-strided", "q-offset-16", "kv-block-stride-16"]
# Calls the Python path launches but the fast check leaves to the router (it may be stricter, never looser): none
# of these cases.
STRICTER: list = []


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    if shutil.which("c++") is None:
        pytest.skip("needs a host C++ compiler (c++) to build paged_indexer_logits_route.cpp for the CPU key")
    env = dict(os.environ, HOME=str(tmp_path_factory.mktemp("home")))
    p = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULTS ")]
    assert p.returncode == 0 and lines, f"route build or run failed (exit {p.returncode}):\n{p.stdout}{p.stderr}"
    return json.loads(lines[-1][len("RESULTS "):])


def test_served_only_where_python_launches_the_cuda_provider(gate):
    wrong = {name: r for name, r in gate.items() if r[0] == "served" and not r[1]}
    assert not wrong, f"the C++ check serves calls the Python path declines: {wrong}"
    assert all(r[0] in ("served", "router") for r in gate.values()), gate


def test_common_calls_are_served(gate):
    assert {name: gate[name] for name in SERVED} == {name: ["served", True] for name in SERVED}


def test_only_the_known_stricter_cases_differ(gate):
    differ = sorted(name for name, r in gate.items() if (r[0] == "served") != r[1] and name != "mask-off")
    assert differ == sorted(STRICTER), gate


def test_a_zero_mask_hands_every_call_to_the_router(gate):
    assert gate["mask-off"][0] == "router"
