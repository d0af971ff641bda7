"""Per-call host overhead of the device router on CPU (no GPU): `python tools/host_overhead_cpu.py [--calls N]`.

What it runs: exactly the Python that torch.ops.dsa.<op> runs for CUDA tensors (the functions dsa_ops
registers for the CUDA key, captured at import and registered for CPU in this process only), served by
the real "cuda" provider code of topk and page_table_transform (backends_cuda) with its availability
forced to yes and its kernel lookup pointed at stubs: compiled stable-ABI ops with the real bindings'
schemas (built here with the host C++ compiler, a few seconds, cached) that only check `out`'s rank.
What it cannot see: the CUDA-only host costs (the CUDA caching allocator, the kernel launch and the
current-stream lookup inside the binding). Times are this thread's CPU time (other load on the
machine does not count, though it still disturbs caches: read the min column).

Baselines beside each number: a bare `torch.ops.aten` call, the stub kernel alone, the provider's own
work (`torch.empty` + stub kernel), which no router change can remove, the dispatcher -> Python hop
that any Python impl pays, and a C++ impl of topk's functional schema (checks + allocation): the
cost if the op's CUDA impl were C++ instead of a Python router.

"route" rows: the real C++ kernels of the top-k family's dsa ops (backends_cuda/csrc/topk_route.cpp,
what the CUDA library registers for the CUDA key), built here for the CPU key of copies of the ops
(`dsa_hob::*`, same schemas) with a stub topk_launch (csrc/topk_out.h), and their fallback to the Python router
(`dsa_hob_route::*`, the captured CUDA-key routers, as dsa_route::* on the GPU), taken when the kernels
serve no device (a forced backend other than cuda) or the fast check fails.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import torch

# Capture what dsa_ops registers for the CUDA key before it is imported.
_captured: dict = {}
_orig_impl = torch.library.Library.impl


def _spy(self, op_name, fn, dispatch_key="", **kwargs):
    if self.ns == "dsa" and dispatch_key == "CUDA":
        _captured[op_name] = fn
    return _orig_impl(self, op_name, fn, dispatch_key, **kwargs)


torch.library.Library.impl = _spy
try:
    import dsa_ops
    from dsa_ops import registry
finally:
    torch.library.Library.impl = _orig_impl

STUB_SRC = r"""
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <cstdint>
#include <optional>
using torch::stable::Tensor;
using torch::headeronly::ScalarType;
namespace {
// The alternative to a Python router: a C++ impl with the functional op's own schema that checks its
// arguments (as far as C++ can name them), allocates the output and would launch the kernel.
Tensor topk(Tensor scores, int64_t k, std::optional<Tensor> lengths, std::optional<Tensor> row_starts,
            bool deterministic) {
  STD_TORCH_CHECK(scores.dim() == 2 && k >= 1, "dsa.topk: bad arguments");
  auto st = scores.scalar_type();
  STD_TORCH_CHECK(st == ScalarType::Float || st == ScalarType::BFloat16 || st == ScalarType::Half,
                  "dsa.topk: `scores` dtype");
  STD_TORCH_CHECK(scores.stride(1) == 1 || scores.size(1) <= 1, "dsa.topk: `scores` stride");
  for (const auto* t : {&lengths, &row_starts}) {
    STD_TORCH_CHECK(!t->has_value() || ((*t)->dim() == 1 && (*t)->size(0) == scores.size(0) &&
                                        (*t)->scalar_type() == ScalarType::Int &&
                                        (*t)->get_device_index() == scores.get_device_index()),
                    "dsa.topk: window tensors");
  }
  int64_t size[2] = {scores.size(0), k};
  return torch::stable::new_empty(scores, {size, 2}, ScalarType::Int);
}
void topk_out(Tensor scores, int64_t k, std::optional<Tensor> lengths, std::optional<Tensor> row_starts,
              bool deterministic, std::optional<Tensor> page_table, std::optional<Tensor> page_table_row_starts,
              std::optional<Tensor> row_to_batch, int64_t page_size, std::optional<Tensor> offsets, Tensor out,
              std::optional<Tensor> out_raw, bool nan_first) {
  STD_TORCH_CHECK(out.dim() == 2, "topk_out stub: bad out");
}
void page_table_transform_out(Tensor indices, Tensor page_table, std::optional<Tensor> row_to_batch,
                              std::optional<Tensor> page_table_row_starts, int64_t page_size, Tensor out) {
  STD_TORCH_CHECK(out.dim() == 2, "page_table_transform_out stub: bad out");
}
}  // namespace
STABLE_TORCH_LIBRARY(dsa_host_overhead_stub, m) {
  m.def("topk_out(Tensor scores, int k, Tensor? lengths, Tensor? row_starts, bool deterministic, "
        "Tensor? page_table, Tensor? page_table_row_starts, Tensor? row_to_batch, int page_size, "
        "Tensor? offsets, Tensor(a!) out, Tensor(b!)? out_raw, bool nan_first=False) -> ()");
  m.def("page_table_transform_out(Tensor indices, Tensor page_table, Tensor? row_to_batch, "
        "Tensor? page_table_row_starts, int page_size, Tensor(a!) out) -> ()");
  m.def("topk(Tensor scores, int k, *, Tensor? lengths=None, Tensor? row_starts=None, "
        "bool deterministic=False) -> Tensor");
}
STABLE_TORCH_LIBRARY_IMPL(dsa_host_overhead_stub, CPU, m) {
  m.impl("topk_out", TORCH_BOX(&topk_out));
  m.impl("page_table_transform_out", TORCH_BOX(&page_table_transform_out));
  m.impl("topk", TORCH_BOX(&topk));
}
"""


def _cached_source(folder: str, name: str, text: str) -> tuple[str, str]:
    """(build folder, path of `name` in it holding `text`) under ~/.cache/dsa_ops/<folder>/<torch version>;
    the file is rewritten only when its text changed, so the build cache stays valid."""
    root = os.path.join(os.path.expanduser("~"), ".cache", "dsa_ops", folder, torch.__version__)
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, name)
    if not os.path.exists(path) or open(path).read() != text:
        with open(path, "w") as f:
            f.write(text)
    return root, path


def build_stub():
    """The stub kernels as (topk_out, page_table_transform_out) OpOverloads (and torch.ops.dsa_host_overhead_stub.topk,
    a C++ impl of topk's functional schema: what registering C++ directly for the op would cost)."""
    from torch.utils import cpp_extension

    root, src = _cached_source("host_overhead_stub", "stub.cpp", STUB_SRC)
    cpp_extension.load(name="dsa_host_overhead_stub", sources=[src], build_directory=root, is_python_module=False,
                       extra_cflags=["-O2", "-DTORCH_TARGET_VERSION=0x020b000000000000"], verbose=False)
    ns = torch.ops.dsa_host_overhead_stub
    return ns.topk_out.default, ns.page_table_transform_out.default


ROUTE_STUB_SRC = r"""
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>
#include "topk_out.h"
// The launch, stubbed as the stub kernels above: what topk_route.cpp calls on its fast path (topk_out's
// core after the route's own check; the real one fills the params and launches on the current stream).
void dsa_cuda_binding::topk_launch(const TopkCall& call) {
  STD_TORCH_CHECK(call.out->dim == 2, "topk_launch stub: bad out");
}
"""
ROUTED = ("topk", "topk_page_table_transform", "topk_ragged_transform")


def build_route():
    """backends_cuda/csrc/topk_route.cpp for the CPU key of dsa_hob::* (copies of the routed dsa ops), falling
    back to dsa_hob_route::* (the captured CUDA-key routers, behind _route's error keeping, as on the GPU).
    Returns torch.ops.dsa_hob_ctl.topk_route_set (a device mask; any non-zero value serves the CPU)."""
    from dsa_ops import _route
    from dsa_ops._define import OPS
    from torch.utils import cpp_extension

    csrc = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "backends_cuda", "csrc")
    defs = torch.library.Library("dsa_hob", "DEF")
    routes = torch.library.Library("dsa_hob_route", "DEF")
    for name in ROUTED:
        d = OPS[name]
        forms = [(name, d.schema)] + ([(f"{name}.out", d.out.schema)] if d.out is not None else [])
        for overload, schema in forms:
            defs.define(f"{overload}{schema}")
            routes.define(f"{overload}{schema}")
            routes.impl(overload, _route._keeping_errors(_captured[overload]), "CPU")
    root, stub = _cached_source("host_overhead_route", "route_stub.cpp", ROUTE_STUB_SRC)
    flags = ["-O2", "-DTORCH_TARGET_VERSION=0x020b000000000000", "-DDSA_TOPK_ROUTE_CPU_TEST",
             "-DDSA_TOPK_ROUTE_NS=dsa_hob", "-DDSA_TOPK_ROUTE_KEY=CPU", "-DDSA_TOPK_ROUTE_FALLBACK_NS=dsa_hob_route",
             "-DDSA_TOPK_ROUTE_CONTROL_NS=dsa_hob_ctl"]
    cpp_extension.load(name="dsa_host_overhead_route", sources=[os.path.join(csrc, "topk_route.cpp"), stub],
                       build_directory=root, is_python_module=False, extra_cflags=flags,
                       extra_include_paths=[os.path.abspath(p) for p in (csrc, os.path.join(csrc, "..", "include"))],
                       verbose=False)
    _route.set_error_sink(torch.ops.dsa_hob_ctl.topk_route_error.default)
    return (defs, routes), torch.ops.dsa_hob_ctl.topk_route_set.default


def install(stub_topk, stub_ptt):
    """Route dsa.* CPU calls through the CUDA-key router, and serve them by the real "cuda" provider code
    (backends_cuda/providers_topk.py, page_table_transform.py) with its kernel lookup pointed at the stubs."""
    import dsa_ops.backends.cuda as cuda_backend
    from dsa_ops.backends.cuda import page_table_transform as cuda_ptt
    from dsa_ops.backends.cuda import providers_topk

    lib = torch.library.Library("dsa", "FRAGMENT")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, fn in _captured.items():
            lib.impl(name, fn, "CPU")
    stubs = {"topk_out": stub_topk, "page_table_transform_out": stub_ptt}
    cuda_backend.op = lambda name, device=None: stubs[name]
    cuda_ptt._fn = None
    ok = lambda dev: None  # noqa: E731
    providers_topk.register_topk(registry.Provider, registry.register_provider, cuda_backend.op, ok)
    registry.register_provider(registry.Provider("page_table_transform", "cuda", cuda_ptt.run, cuda_ptt.supports, ok))

    def topk_work(scores, k):  # what a topk provider must do at least: allocate, call the kernel
        out = torch.empty((scores.shape[0], k), dtype=torch.int32, device=scores.device)
        stub_topk(scores, k, None, None, False, None, None, None, 64, None, out, None)
        return out

    # The floor of any Python impl: a no-op with topk's schema, called through the dispatcher.
    lib.define("host_overhead_noop(Tensor scores, int k, *, Tensor? lengths=None, Tensor? row_starts=None, "
               "bool deterministic=False) -> Tensor")
    lib.impl("host_overhead_noop", lambda scores, k, **kw: scores, "CPU")
    return lib, topk_work


def per_call_us(fn, calls: int, repeats: int) -> tuple[float, float]:
    """(median, min) over `repeats` runs of `calls` back-to-back calls, in us of this thread's CPU time
    per call (time the machine spends on other work does not count; torch runs on this thread only)."""
    for _ in range(min(calls, 500)):
        fn()
    runs = []
    for _ in range(repeats):
        t0 = time.thread_time()
        for _ in range(calls):
            fn()
        runs.append((time.thread_time() - t0) / calls * 1e6)
    return statistics.median(runs), min(runs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=5000, help="back-to-back calls per run")
    ap.add_argument("--runs", type=int, default=21, help="runs per row (min is the least disturbed one)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    stub_topk, stub_ptt = build_stub()
    _lib, topk_work = install(stub_topk, stub_ptt)
    _route_libs, route_set = build_route()
    hob = torch.ops.dsa_hob
    topk_fn = registry.providers("topk")["cuda"].fn

    scores = torch.randn(1, 131072)
    out_k = torch.empty(1, 2048, dtype=torch.int32)
    lengths = torch.full((1,), 100000, dtype=torch.int32)
    row_starts = torch.zeros(1, dtype=torch.int32)
    idx = torch.randint(-1, 4096 * 64, (64, 2048), dtype=torch.int32)
    pt = torch.randint(0, 1 << 20, (8, 4096), dtype=torch.int32)
    rtb = torch.randint(0, 8, (64,), dtype=torch.int32)
    out_p = torch.empty_like(idx)

    offsets = torch.zeros(1, dtype=torch.int32)
    pt1 = torch.randint(0, 1 << 20, (1, 4096), dtype=torch.int32)

    # The router really runs (and reaches the stub): a wrong path fails here, not in the numbers.
    assert registry.select("topk", (scores, 2048, None, None, False, False)).fn is topk_fn
    assert dsa_ops.topk(scores, 2048).shape == (1, 2048)
    # The route: served by C++ (the Python router is not entered), else by the router with its errors.
    entered, provider = [], registry.providers("topk")["cuda"]
    registry.register_provider(registry.Provider("topk", "cuda", lambda *a: entered.append(a) or topk_fn(*a),
                                                 registry.providers("topk")["cuda"].supports, lambda dev: None))
    route_set(1)
    assert hob.topk(scores, 2048).shape == (1, 2048) and not entered
    route_set(0)
    assert hob.topk(scores, 2048).shape == (1, 2048) and len(entered) == 1
    route_set(1)
    try:
        hob.topk(scores, 0)
        raise AssertionError("k=0 passed")
    except RuntimeError as e:
        assert str(e).startswith("dsa.topk: `k` must be >= 1, got 0"), e
    registry.register_provider(provider)

    rows = [
        ("baseline: torch.ops.aten.zero_.default(out)", lambda: torch.ops.aten.zero_.default(out_k), None),
        ("baseline: stub kernel alone (12-arg stable-ABI op)",
         lambda: stub_topk(scores, 2048, None, None, False, None, None, None, 64, None, out_k, None), None),
        ("baseline: topk provider work (torch.empty + stub kernel)", lambda: topk_work(scores, 2048), None),
        ("topk provider fn alone (real glue, stub kernel)",
         lambda: topk_fn(scores, 2048, None, None, False, False), None),
        ("floor: dispatcher -> Python no-op with topk's schema",
         lambda: torch.ops.dsa.host_overhead_noop(scores, 2048), None),
        ("router alone: topk's CUDA-key function called directly", lambda: _captured["topk"](scores, 2048), None),
        ("alternative: C++ impl with topk's schema (checks, alloc; no Python)",
         lambda: torch.ops.dsa_host_overhead_stub.topk(scores, 2048), None),
        ("torch.ops.dsa.topk(scores, 2048)  [auto order]", lambda: torch.ops.dsa.topk(scores, 2048), None),
        ("torch.ops.dsa.topk(scores, 2048)  [use_backend('cuda')]", lambda: torch.ops.dsa.topk(scores, 2048),
         "cuda"),
        ("dsa_ops.topk(scores, 2048)  [auto]", lambda: dsa_ops.topk(scores, 2048), None),
        ("dsa_ops.topk(scores, 2048, lengths=, row_starts=)  [auto]",
         lambda: dsa_ops.topk(scores, 2048, lengths=lengths, row_starts=row_starts), None),
        ("baseline: stub page_table_transform_out alone",
         lambda: stub_ptt(idx, pt, rtb, None, 64, out_p), None),
        ("dsa_ops.page_table_transform(..., out=out)  [use_backend('cuda')]",
         lambda: dsa_ops.page_table_transform(idx, pt, row_to_batch=rtb, page_size=64, out=out_p), "cuda"),
        ("torch.ops.dsa.page_table_transform(idx, pt, row_to_batch=rtb)  [auto]",
         lambda: torch.ops.dsa.page_table_transform(idx, pt, row_to_batch=rtb), None),
        ("route: C++ kernel, dsa_hob.topk(scores, 2048)", lambda: hob.topk(scores, 2048), 1),
        ("route: C++ kernel, dsa_hob.topk(.., lengths=, row_starts=)",
         lambda: hob.topk(scores, 2048, lengths=lengths, row_starts=row_starts), 1),
        ("route: C++ kernel, dsa_hob.topk_page_table_transform(.., out=)",
         lambda: hob.topk_page_table_transform.out(scores, pt1, lengths, 2048, out=out_k), 1),
        ("route: C++ kernel, dsa_hob.topk_ragged_transform(..)",
         lambda: hob.topk_ragged_transform(scores, offsets, lengths, 2048), 1),
        ("route fallback: C++ kernel -> Python router, dsa_hob.topk(scores, 2048)",
         lambda: hob.topk(scores, 2048), 0),
        ("Python router alone, torch.ops.dsa.topk(scores, 2048)", lambda: torch.ops.dsa.topk(scores, 2048), None),
        ("Python router alone, torch.ops.dsa.topk_page_table_transform(.., out=)",
         lambda: torch.ops.dsa.topk_page_table_transform.out(scores, pt1, lengths, 2048, out=out_k), None),
    ]
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, {args.runs} runs x {args.calls} calls, "
          "1 thread, us of thread CPU time per call")
    print(f"{'call':<72} {'median us':>10} {'min us':>8}")
    for name, fn, backend in rows:
        if isinstance(backend, int):  # a route row: the device mask the C++ kernels serve
            route_set(backend)
            backend = None
        with registry.use_backend(backend):
            med, lo = per_call_us(fn, args.calls, args.runs)
        print(f"{name:<72} {med:>10.2f} {lo:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
