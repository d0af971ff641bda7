"""Where the top-k ops' per-call host time goes (H200 host). Dev tool:

    python tools/probe_host.py [passes]     # the rows below, interleaved
    python tools/probe_host.py conditions   # dsa.topk as bench_topk.py times it, under its conditions
    python -m pytest -q -s tools/probe_host.py   # the same under pytest

Every row is timed as bench_topk.py's host overhead (back-to-back calls, no sync inside, batches of 100,
synchronised between batches), and the rows' batches are taken in turn, so that the host's pace, which
swings by 3-4 us a call between and within processes (benchmarks/results/h200_host_overhead_spread.log),
meets all rows alike.
Prints each row's median per-call time (us) in each pass.

Beside the ops, stub ops compiled here with the bindings' calling convention (stable ABI, CUDA key, topk's
schema) peel the path apart: the dispatcher and the boxed stable call alone, then the output allocation,
then the device guard and stream lookup, then a bare launch (cudart or the driver, the filter kernel's
launch shape), then the library's own launcher and binding core (the stubs link the loaded library), and
the same kernel under ops defined from Python. What is left of dsa.topk over those is the route's own
(tools/smxx_launch_host_cost.cu times the launch APIs without torch). A row may set something
up around its batch (a forced cluster size; a fallthrough kernel for the AutogradCUDA key, which skips the
autograd fallback the dispatcher runs for ops without an autograd formula).
"""

import os
import statistics
import sys
import time

import dsa_ops  # noqa: F401  (registers torch.ops.dsa)
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))  # harness, topk_cases
from harness import host_batch_us, interleaved_samples  # noqa: E402
from topk_cases import page_table_args  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STUB_SRC = r"""
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>
#include <cstdint>
#include <optional>
#include <string>

#include "dsa_cuda/topk.cuh"
#include "topk_out.h"
using torch::stable::Tensor;
using Opt = std::optional<Tensor>;

// stub_launch.cu: 0 = cudaLaunchKernelEx (PDL, cluster 8), 1 = the same with 512 threads and ~90 KB of
// dynamic shared memory (the filter kernel's launch shape), 2 = cuLaunchKernelEx with the function cached.
extern "C" int stub_launch(int how, void* stream, void* a, void* b);

namespace {
struct Info {  // what the bindings read of a tensor (csrc/topk_out.h, info_of)
  int64_t dim;
  int64_t* sizes;
  int64_t* strides;
  int32_t dtype, type, index;
  void* data;
};
Info info(const Tensor& t) {
  Info i{};
  aoti_torch_get_dim(t.get(), &i.dim);
  aoti_torch_get_sizes(t.get(), &i.sizes);
  aoti_torch_get_strides(t.get(), &i.strides);
  aoti_torch_get_dtype(t.get(), &i.dtype);
  aoti_torch_get_device_type(t.get(), &i.type);
  aoti_torch_get_device_index(t.get(), &i.index);
  aoti_torch_get_data_ptr(t.get(), &i.data);
  return i;
}
Tensor alloc_out(const Tensor& s, int64_t k) {
  int64_t size[2] = {s.size(0), k};
  int64_t stride[2] = {k, 1};
  int32_t type = 0, index = 0;
  aoti_torch_get_device_type(s.get(), &type);
  aoti_torch_get_device_index(s.get(), &index);
  AtenTensorHandle h = nullptr;
  STD_TORCH_CHECK(aoti_torch_empty_strided(2, size, stride, aoti_torch_dtype_int32(), type, index, &h) ==
                  AOTI_TORCH_SUCCESS, "alloc failed");
  return Tensor(h);
}
void* stream_of(const Tensor& s) {
  int32_t index = 0;
  aoti_torch_get_device_index(s.get(), &index);
  void* stream = nullptr;
  aoti_torch_get_current_cuda_stream(index, &stream);
  return stream;
}
Tensor ret(Tensor s, int64_t, Opt, Opt, bool) { return s; }
Tensor alloc(Tensor s, int64_t k, Opt, Opt, bool) { return alloc_out(s, k); }
Tensor alloc_drop(Tensor s, int64_t k, Opt, Opt, bool) {
  { Tensor o = alloc_out(s, k); }
  return s;
}
Tensor alloc_stream(Tensor s, int64_t k, Opt, Opt, bool) {
  STD_TORCH_CHECK(stream_of(s) != reinterpret_cast<void*>(1), "");
  return alloc_out(s, k);
}
Tensor alloc_guard(Tensor s, int64_t k, Opt, Opt, bool) {
  int32_t index = 0;
  aoti_torch_get_device_index(s.get(), &index);
  torch::stable::accelerator::DeviceGuard guard(index);
  STD_TORCH_CHECK(stream_of(s) != reinterpret_cast<void*>(1), "");
  return alloc_out(s, k);
}
template <int kHow>
Tensor launch(Tensor s, int64_t k, Opt, Opt, bool) {
  const Info si = info(s);
  Tensor o = alloc_out(s, k);
  const Info oi = info(o);
  STD_TORCH_CHECK(stub_launch(kHow, stream_of(s), si.data, oi.data) == 0, "stub launch failed");
  return o;
}
// The library's launcher (dsa_cuda::launch_topk), its params filled as topk_launch fills them for a plain
// fp32 call: the launcher's host logic over a bare launch.
Tensor real_launcher(Tensor s, int64_t k, Opt, Opt, bool) {
  const Info si = info(s);
  Tensor o = alloc_out(s, k);
  const Info oi = info(o);
  dsa_cuda::TopkParams p = {};
  p.scores = si.data;
  p.dtype = dsa_cuda::TopkDtype::kFloat32;
  p.rows = si.sizes[0];
  p.width = si.sizes[1];
  p.row_stride = si.strides[0];
  p.k = k;
  p.out = static_cast<int32_t*>(oi.data);
  p.out_stride = k;
  p.mode = dsa_cuda::TopkMode::kPlain;
  p.page_size = 1;
  STD_TORCH_CHECK(dsa_cuda::launch_topk(p, static_cast<cudaStream_t>(stream_of(s))) == cudaSuccess, "launch");
  return o;
}
// The binding's core (dsa_cuda_binding::topk_launch: device guard, stream, params, launcher).
Tensor real_binding(Tensor s, int64_t k, Opt, Opt, bool) {
  const dsa_cuda_binding::TensorInfo si = dsa_cuda_binding::info_of(s);
  Tensor o = alloc_out(s, k);
  const dsa_cuda_binding::TensorInfo oi = dsa_cuda_binding::info_of(o);
  using dsa_cuda_binding::TopkCall;
  dsa_cuda_binding::topk_launch(
      TopkCall{&si, k, nullptr, nullptr, false, nullptr, nullptr, nullptr, 64, nullptr, &oi, nullptr});
  return o;
}
void out12(Tensor, int64_t, Opt, Opt, bool, Opt, Opt, Opt, int64_t, Opt, Tensor, Opt) {}
}  // namespace

STABLE_TORCH_LIBRARY(dsa_hstub, m) {
  const std::string args = "(Tensor scores, int k, *, Tensor? lengths=None, Tensor? row_starts=None, "
                           "bool deterministic=False) -> Tensor";
  for (const char* name : {"ret", "alloc", "alloc_drop", "alloc_stream", "alloc_guard", "launch_ex",
                           "launch_ex_big", "launch_cu", "real_launcher", "real_binding"}) {
    m.def((name + args).c_str());
  }
  m.def("out12(Tensor scores, int k, Tensor? lengths, Tensor? row_starts, bool deterministic, "
        "Tensor? page_table, Tensor? page_table_row_starts, Tensor? row_to_batch, int page_size, "
        "Tensor? offsets, Tensor(a!) out, Tensor(b!)? out_raw) -> ()");
}
STABLE_TORCH_LIBRARY_IMPL(dsa_hstub, CUDA, m) {
  m.impl("ret", TORCH_BOX(&ret));
  m.impl("alloc", TORCH_BOX(&alloc));
  m.impl("alloc_drop", TORCH_BOX(&alloc_drop));
  m.impl("alloc_stream", TORCH_BOX(&alloc_stream));
  m.impl("alloc_guard", TORCH_BOX(&alloc_guard));
  m.impl("launch_ex", TORCH_BOX(&launch<0>));
  m.impl("launch_ex_big", TORCH_BOX(&launch<1>));
  m.impl("launch_cu", TORCH_BOX(&launch<2>));
  m.impl("real_launcher", TORCH_BOX(&real_launcher));
  m.impl("real_binding", TORCH_BOX(&real_binding));
  m.impl("out12", TORCH_BOX(&out12));
}
// The same kernel for ops defined from Python (define_python_ops): what a Python definition adds.
STABLE_TORCH_LIBRARY_IMPL(dsa_hstub_py, CUDA, m) {
  m.impl("real_binding", TORCH_BOX(&real_binding));
  m.impl("real_binding_faked", TORCH_BOX(&real_binding));
}
"""

LAUNCH_SRC = r"""
#include <cuda.h>
#include <cuda_runtime.h>

#include "dsa_cuda/common_launch.cuh"  // launch_detail: the library's attribute fill and driver entry point

namespace launch_detail = dsa_cuda::launch_detail;

struct Params {
  const void* a;
  void* b;
  char rest[208];  // (the top-k kernels' KernelArgs is ~220 bytes)
};

__global__ void stub_kernel(Params p) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (p.rest[0] == 123 && threadIdx.x == 1000) {
    static_cast<int*>(p.b)[0] = 1;  // never: keeps the parameters live
  }
}

extern "C" int stub_launch(int how, void* stream, void* a, void* b) {
  constexpr int kBigSmem = 90 * 1024;
  static bool once = [] {
    cudaFuncSetAttribute(stub_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBigSmem);
    return true;
  }();
  (void)once;
  Params p = {};
  p.a = a;
  p.b = b;
  if (how == 2) {
    static const launch_detail::DriverLaunch launch_ex = launch_detail::driver_launch();
    static const cudaFunction_t fn = [] {
      cudaFunction_t f = nullptr;
      cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(stub_kernel));
      return f;
    }();
    if (launch_ex == nullptr || fn == nullptr) {
      return 1;
    }
    CUlaunchConfig cfg = {};
    cfg.gridDimX = 8;
    cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 512;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.sharedMemBytes = kBigSmem;
    cfg.hStream = static_cast<CUstream>(stream);
    CUlaunchAttribute attrs[2];
    cfg.attrs = attrs;
    cfg.numAttrs = launch_detail::fill_attributes(attrs, true, 8, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                                                  CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
    void* args[] = {&p};
    return launch_ex(&cfg, reinterpret_cast<CUfunction>(fn), args, nullptr) == CUDA_SUCCESS ? 0 : 1;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(8);
  cfg.blockDim = dim3(how == 1 ? 512 : 128);
  cfg.dynamicSmemBytes = how == 1 ? kBigSmem : 0;
  cfg.stream = static_cast<cudaStream_t>(stream);
  cudaLaunchAttribute attrs[2];
  cfg.attrs = attrs;
  cfg.numAttrs = launch_detail::fill_attributes(attrs, true, 8, cudaLaunchAttributeProgrammaticStreamSerialization,
                                                cudaLaunchAttributeClusterDimension);
  return cudaLaunchKernelEx(&cfg, stub_kernel, p) == cudaSuccess ? 0 : 1;
}
"""


def build_stubs(lib_path: str):
    """The stub ops, linked to the loaded dsa_ops CUDA library (`lib_path`) for its launcher."""
    from torch.utils import cpp_extension

    root = os.path.join(os.path.expanduser("~"), ".cache", "dsa_ops", "probe_host")
    os.makedirs(root, exist_ok=True)
    srcs = []
    for name, text in (("stubs.cpp", STUB_SRC), ("stub_launch.cu", LAUNCH_SRC)):
        srcs.append(os.path.join(root, name))
        with open(srcs[-1], "w") as f:
            f.write(text)
    t = time.time()
    cpp_extension.load(name="dsa_probe_host_stubs", sources=srcs, build_directory=root, is_python_module=False,
                       with_cuda=True, extra_cflags=["-O2", "-DUSE_CUDA", "-DTORCH_TARGET_VERSION=0x020b000000000000"],
                       extra_cuda_cflags=["-O2", "-gencode=arch=compute_90a,code=sm_90a"],
                       extra_include_paths=[os.path.join(REPO, "backends_cuda", "include"),
                                            os.path.join(REPO, "backends_cuda", "csrc")],
                       extra_ldflags=[lib_path, f"-Wl,-rpath,{os.path.dirname(lib_path)}"])
    print(f"stub ops built in {time.time() - t:.1f} s", flush=True)
    return torch.ops.dsa_hstub


def define_python_ops():
    """dsa_hstub_py::real_binding (defined from Python) and real_binding_faked (also a fake and a CPU
    kernel, as ops_core._define gives every dsa op), served on CUDA by the stub's real_binding."""
    lib = torch.library.Library("dsa_hstub_py", "DEF")
    schema = ("(Tensor scores, int k, *, Tensor? lengths=None, Tensor? row_starts=None, bool deterministic=False)"
              " -> Tensor")
    lib.define("real_binding" + schema)
    lib.define("real_binding_faked" + schema)
    fake = lambda scores, k, **kw: scores.new_empty(scores.shape[0], k, dtype=torch.int32)  # noqa: E731
    torch.library.register_fake("dsa_hstub_py::real_binding_faked", fake, lib=lib)
    lib.impl("real_binding_faked", fake, "CPU")
    return lib


def timed_batch(fn, calls, setup=None, teardown=None) -> float:
    """harness.host_batch_us of fn, with `setup` before the batch and `teardown` after it."""
    if setup:
        setup()
    try:
        return host_batch_us(fn, calls)
    finally:
        if teardown:
            teardown()


def main(passes: int = 3, batches: int = 10, calls: int = 100):
    x1 = torch.randn(1, 131072, device="cuda")
    torch.ops.dsa.topk(x1, 2048)  # (loads the library: torch.ops.dsa_cuda exists from here)
    from dsa_ops.backends import cuda as cuda_backend

    py_lib = define_python_ops()  # noqa: F841  (kept alive: its registrations go with it)
    stub = build_stubs(os.path.abspath(cuda_backend.LIB.path))
    pyd = torch.ops.dsa_hstub_py
    x64 = torch.randn(64, 8192, device="cuda")
    out1 = torch.empty(1, 2048, dtype=torch.int32, device="cuda")
    pt, lengths = page_table_args(1, 131072)
    a16, b16 = torch.zeros(16, device="cuda"), torch.empty(16, device="cuda")
    topk_out = torch.ops.dsa_cuda.topk_out
    fall = {}

    def fallthrough_on():
        fall["lib"] = lib = torch.library.Library("dsa", "IMPL")
        lib.impl("topk", torch.library.fallthrough_kernel, "AutogradCUDA")

    def fallthrough_off():
        fall.pop("lib")._destroy()

    def cluster(c):  # (the launcher reads the variable at its first launch and when told)
        def on():
            os.environ["DSA_OPS_TOPK_CLUSTER"] = c
            torch.ops.dsa_cuda.topk_read_env()

        def off():
            os.environ.pop("DSA_OPS_TOPK_CLUSTER", None)
            torch.ops.dsa_cuda.topk_read_env()

        return on, off

    rows = [
        ("torch.add(16, out=)", lambda: torch.add(a16, 1, out=b16)),
        ("torch.ops.aten.add.out(16, out=)", lambda: torch.ops.aten.add.out(a16, 1, out=b16)),
        ("torch.empty(1x2048 int32)", lambda: torch.empty(1, 2048, dtype=torch.int32, device="cuda")),
        ("aten.zero_(1x2048)", lambda: torch.ops.aten.zero_.default(out1)),
        ("stub: dispatcher + boxed call (returns scores)", lambda: stub.ret(x1, 2048)),
        ("stub: + allocation of out", lambda: stub.alloc(x1, 2048)),
        ("stub: allocation freed inside (no new Python tensor)", lambda: stub.alloc_drop(x1, 2048)),
        ("stub: + allocation, stream", lambda: stub.alloc_stream(x1, 2048)),
        ("stub: + allocation, device guard, stream", lambda: stub.alloc_guard(x1, 2048)),
        ("stub: + allocation, stream, metadata, cudaLaunchKernelEx", lambda: stub.launch_ex(x1, 2048)),
        ("stub: as above, 512 threads, 90 KB shared memory", lambda: stub.launch_ex_big(x1, 2048)),
        ("stub: as above, cuLaunchKernelEx (function cached)", lambda: stub.launch_cu(x1, 2048)),
        ("stub: alloc, stream, metadata, the library's launch_topk", lambda: stub.real_launcher(x1, 2048)),
        ("stub: alloc, metadata, the library's topk_launch (+guard)", lambda: stub.real_binding(x1, 2048)),
        ("as above, the op defined from Python", lambda: pyd.real_binding(x1, 2048)),
        ("as above, the op defined from Python with a fake and CPU kernel", lambda: pyd.real_binding_faked(x1, 2048)),
        ("stub: topk_out's 12 arguments, no work", lambda: stub.out12(x1, 2048, None, None, False, None, None, None,
                                                                       64, None, out1, None)),
        ("dsa.topk 1x131072 (8-CTA clusters)", lambda: torch.ops.dsa.topk(x1, 2048)),
        ("dsa.topk.default 1x131072", lambda: torch.ops.dsa.topk.default(x1, 2048)),
        ("dsa.topk 1x131072, AutogradCUDA fallthrough", lambda: torch.ops.dsa.topk(x1, 2048), fallthrough_on,
         fallthrough_off),
        ("dsa.topk 1x131072, 1 CTA (no cluster attribute)", lambda: torch.ops.dsa.topk(x1, 2048), *cluster("1")),
        ("dsa.topk 64x8192 (one-CTA rows)", lambda: torch.ops.dsa.topk(x64, 2048)),
        ("dsa.topk 1x131072 deterministic", lambda: torch.ops.dsa.topk(x1, 2048, deterministic=True)),
        ("dsa_cuda.topk_out 1x131072 (binding, no route, no alloc)",
         lambda: topk_out(x1, 2048, None, None, False, None, None, None, 64, None, out1, None)),
        ("dsa.topk_page_table_transform.out 1x131072",
         lambda: torch.ops.dsa.topk_page_table_transform.out(x1, pt, lengths, 2048, page_size=64, out=out1)),
    ]
    for row in rows:  # warm-up: every path once, then a batch each
        timed_batch(row[1], calls, *row[2:])
    samplers = [lambda row=row: timed_batch(row[1], calls, *row[2:]) for row in rows]
    got = {row[0]: [] for row in rows}
    for _ in range(passes):
        for row, samples in zip(rows, interleaved_samples(samplers, batches)):
            got[row[0]].append(statistics.median(samples))
    print(f"us a call, median of {batches} batches of {calls}, {passes} passes (batches of all rows in turn)")
    for name, v in got.items():
        print(f"{name:58s} " + " ".join(f"{t:6.2f}" for t in v), flush=True)


def conditions():
    """dsa.topk's per-call host time as bench_topk.py takes it (harness.host_overheads_us beside torch.add,
    the bench's input), in this process: plain, inside registry.use_backend("cuda"), after a graph timing
    of the call; with the times the Python router ran the cuda provider (0 when the C++ route serves).
    test_conditions runs it under pytest, as the bench runs."""
    from dsa_ops import registry
    from harness import Timer, host_overheads_us
    from topk_cases import make_scores

    x = make_scores(1, 131072, "float32", "normal")
    a16, b16 = torch.zeros(16, device="cuda"), torch.empty(16, device="cuda")
    fn = lambda: torch.ops.dsa.topk(x, 2048)  # noqa: E731
    add = lambda: torch.add(a16, 1, out=b16)  # noqa: E731
    fn()  # (loads the library)
    entered = [0]
    provider = registry.providers("topk")["cuda"]
    provider_fn = provider.fn

    def counting(*args):
        entered[0] += 1
        return provider_fn(*args)

    object.__setattr__(provider, "fn", counting)  # (the same provider: the route still counts it as ours)

    def show(tag):
        before = entered[0]
        (med, best), (add_med, _) = host_overheads_us([fn, add], calls=1000, batches=10)
        print(f"{tag:40s} dsa.topk {med:6.2f} (min {best:6.2f}), torch.add {add_med:6.2f}, router ran "
              f"{entered[0] - before} times", flush=True)

    try:
        show("plain")
        with registry.use_backend("cuda"):
            show("inside use_backend('cuda')")
            Timer().graph_median_us(fn)
            show("after a graph timing")
        show("plain again")
    finally:
        object.__setattr__(provider, "fn", provider_fn)


def test_conditions():
    conditions()


if __name__ == "__main__":
    if sys.argv[1:2] == ["conditions"]:
        conditions()
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
