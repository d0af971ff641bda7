// The CUDA-key kernels of the top-k family's dsa ops (dsa::topk, dsa::topk_page_table_transform and its
// .out, dsa::topk_ragged_transform): no Python on the per-call path of the common call.
//
// A call that passes the fast check (the conditions under which the Python router would validate it,
// pick the cuda provider and find its `out` buffers fine) allocates `out` and launches through
// topk_launch (csrc/topk.cpp), topk_out's core without its checks: the fast check proves them. Any
// other call goes to the Python router, registered for the CUDA key of dsa_route::<op>
// (ops_core/_route.py), which gives today's result or error. The Python side also says
// which devices the fast path may serve (topk_route_set: the devices this library was built for, none
// while a backend other than cuda is forced) and hands over the router's error message
// (topk_route_error), which the stable ABI's dispatcher call does not pass back.
//
// tools/host_overhead_cpu.py builds this file with the host compiler for the CPU key of its own
// namespaces (DSA_TOPK_ROUTE_CPU_TEST, a stub topk_launch) to time the path without a GPU.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "dsa_cuda/sm90_topk_heuristics.cuh"
#include "route_common.h"
#include "topk_out.h"

#ifndef DSA_TOPK_ROUTE_CPU_TEST
#define DSA_TOPK_ROUTE_NS dsa
#define DSA_TOPK_ROUTE_KEY CUDA
#define DSA_TOPK_ROUTE_FALLBACK_NS dsa_route
#define DSA_TOPK_ROUTE_CONTROL_NS dsa_cuda
#endif

namespace {

using torch::stable::Tensor;
using OptTensor = std::optional<Tensor>;

constexpr int64_t kInt32Max = 2147483647;
constexpr int64_t kMaxWidth = kInt32Max - 16;  // providers_topk.MAX_WIDTH

// Bit d: the fast path may serve tensors on cuda:d. 0 until Python sets it after the load, and while a
// backend other than cuda is forced. Read on every call, written rarely: relaxed is enough.
std::atomic<uint64_t> g_devices{0};

void topk_route_set(int64_t devices) { g_devices.store(static_cast<uint64_t>(devices), std::memory_order_relaxed); }

// Every route's error sink (route_common.h): the router's message for the call it failed in this thread.
void topk_route_error(std::string message) { dsa_route_common::router_error() = std::move(message); }

// Re-read the launcher's test overrides, DSA_OPS_TOPK_CLUSTER and DSA_OPS_TOPK_SAMPLE (read at the first
// launch otherwise): for tests that change them in-process.
void topk_read_env() { dsa_cuda::topk_heuristics::read_overrides(); }

using dsa_cuda_binding::info_of;
using dsa_cuda_binding::kInt32;
using dsa_cuda_binding::out_ok;
using dsa_cuda_binding::page_table_ok;
using dsa_cuda_binding::ptr;
using dsa_cuda_binding::rows_ok;
using dsa_cuda_binding::score_dtype_ok;
using dsa_cuda_binding::TensorInfo;
using dsa_cuda_binding::TopkCall;

// The shim's device code of the device type served, asked once at load.
#ifdef DSA_TOPK_ROUTE_CPU_TEST
const int32_t kServedType = aoti_torch_device_type_cpu();
#else
const int32_t kServedType = aoti_torch_device_type_cuda();
#endif

bool served(const TensorInfo& t) {
#ifdef DSA_TOPK_ROUTE_CPU_TEST
  return t.device_type == kServedType && g_devices.load(std::memory_order_relaxed) != 0;
#else
  return t.device_type == kServedType && t.device_index >= 0 && t.device_index < 64 &&
         ((g_devices.load(std::memory_order_relaxed) >> t.device_index) & 1);
#endif
}

bool rows_ok(const std::optional<TensorInfo>& t, const TensorInfo& scores) {
  return !t.has_value() || rows_ok(*t, scores);
}

// Python's scores_and_windows_ok and providers_topk._supports, on a served device.
bool scores_ok(const TensorInfo& scores, int64_t k, const std::optional<TensorInfo>& lengths,
               const std::optional<TensorInfo>& row_starts) {
  if (!served(scores) || scores.dim != 2 || k < 1 || k > kInt32Max) {
    return false;
  }
  return score_dtype_ok(scores.dtype) && scores.unit_last_stride() && scores.size(0) <= kInt32Max &&
         scores.size(1) <= kMaxWidth && rows_ok(lengths, scores) && rows_ok(row_starts, scores);
}

// The page-table form's other arguments (validate of topk_page_table_transform.py).
bool page_ok(const TensorInfo& scores, const TensorInfo& page_table,
             const std::optional<TensorInfo>& page_table_row_starts, const std::optional<TensorInfo>& row_to_batch,
             int64_t page_size) {
  return page_size >= 1 && (page_size & (page_size - 1)) == 0 && page_table_ok(page_table, scores) &&
         rows_ok(page_table_row_starts, scores) && rows_ok(row_to_batch, scores);
}

// A new contiguous int32 [rows, k] tensor on the device of `scores` (what new_empty gave), and its
// metadata in `info` (`size` and `stride` must outlive it). aoti_torch_empty_strided reaches
// at::empty_strided directly; new_empty and stable::empty go through the boxed dispatcher by name
// (about 2 us more a call: tools/host_overhead_cpu.py).
Tensor new_out(const TensorInfo& scores, int64_t k, int64_t (&size)[2], int64_t (&stride)[2], TensorInfo* info) {
  size[0] = scores.size(0);
  size[1] = k;
  stride[0] = k;
  stride[1] = 1;
  AtenTensorHandle h = nullptr;
  // (torch 2.11's stable headers have no STABLE_TORCH_ERROR_CODE_CHECK: the device build failed on it)
  if (aoti_torch_empty_strided(2, size, stride, kInt32, scores.device_type, scores.device_index, &h) !=
      AOTI_TORCH_SUCCESS) {
    throw std::runtime_error("dsa top-k: allocating `out` failed");
  }
  *info = TensorInfo{h, 2, size, stride, kInt32, scores.device_type, scores.device_index};
  return Tensor(h);
}

namespace sd = torch::stable::detail;  // from / to: StableIValue conversions

// Run the Python router, dsa_route::<op>, on these arguments and return the stack (results first).
template <typename... Args>
std::array<StableIValue, sizeof...(Args)> call_router(const char* op, const char* overload, const Args&... args) {
  return dsa_route_common::call_router(std::string(DSA_ROUTE_STR(DSA_TOPK_ROUTE_FALLBACK_NS) "::") + op, overload,
                                       args...);
}

// A new `out` for `call` (whose `out` is ignored), the launch into it, and `out`.
Tensor launch_into_new_out(TopkCall call) {
  int64_t size[2];
  int64_t stride[2];
  TensorInfo o;
  Tensor out = new_out(*call.scores, call.k, size, stride, &o);
  call.out = &o;
  dsa_cuda_binding::topk_launch(call);
  return out;
}

Tensor topk(Tensor scores, int64_t k, OptTensor lengths, OptTensor row_starts, bool deterministic, bool nan_first) {
  const TensorInfo s = info_of(scores);
  const std::optional<TensorInfo> len = info_of(lengths);
  const std::optional<TensorInfo> rs = info_of(row_starts);
  if (!scores_ok(s, k, len, rs)) {
    return sd::to<Tensor>(call_router("topk", "", scores, k, lengths, row_starts, deterministic, nan_first)[0]);
  }
  return launch_into_new_out(TopkCall{&s, k, ptr(len), ptr(rs), deterministic, nullptr, nullptr, nullptr, 64,
                                      nullptr, nullptr, nullptr, nan_first});
}

// The page-table form's inputs, read once, and whether the fast path serves them (scores_ok and
// page_ok). Both of its forms start here.
struct PageForm {
  TensorInfo s;
  std::optional<TensorInfo> len;
  std::optional<TensorInfo> rs;
  TensorInfo pt;
  std::optional<TensorInfo> ptrs;
  std::optional<TensorInfo> rtb;
  bool ok;

  PageForm(const Tensor& scores, const Tensor& page_table, const Tensor& lengths, const OptTensor& row_starts,
           const OptTensor& page_table_row_starts, const OptTensor& row_to_batch, int64_t k, int64_t page_size)
      : s(info_of(scores)),
        len(info_of(lengths)),
        rs(info_of(row_starts)),
        pt(info_of(page_table)),
        ptrs(info_of(page_table_row_starts)),
        rtb(info_of(row_to_batch)),
        ok(scores_ok(s, k, len, rs) && page_ok(s, pt, ptrs, rtb, page_size)) {}

  // An out= buffer of this form shares no byte with its inputs (check_out_alone; the outputs against each other
  // are checked by the caller).
  bool apart_from_inputs(const TensorInfo& out) const {
    return disjoint(out, &s) && disjoint(out, &pt) && disjoint(out, ptr(len)) && disjoint(out, ptr(rs)) &&
           disjoint(out, ptr(ptrs)) && disjoint(out, ptr(rtb));
  }

  // The launch of this form into `out` (nullptr: a new one, see launch_into_new_out) and `out_raw`.
  TopkCall call(int64_t k, bool deterministic, bool nan_first, int64_t page_size, const TensorInfo* out,
                const TensorInfo* out_raw) const {
    return TopkCall{&s, k, ptr(len), ptr(rs), deterministic, &pt, ptr(ptrs), ptr(rtb), page_size, nullptr, out,
                    out_raw, nan_first};
  }
};

void topk_page_table_transform_out(Tensor scores, Tensor page_table, Tensor lengths, int64_t k, OptTensor row_starts,
                                   OptTensor page_table_row_starts, OptTensor row_to_batch, int64_t page_size,
                                   bool deterministic, bool nan_first, Tensor out, OptTensor out_raw) {
  const PageForm f(scores, page_table, lengths, row_starts, page_table_row_starts, row_to_batch, k, page_size);
  const TensorInfo o = info_of(out);
  const std::optional<TensorInfo> raw = info_of(out_raw);
  const bool outs_ok = out_ok(o, f.s, k) && f.apart_from_inputs(o) &&
                       (!raw.has_value() || (out_ok(*raw, f.s, k) && f.apart_from_inputs(*raw) && disjoint(o, ptr(raw))));
  if (!(f.ok && outs_ok)) {
    call_router("topk_page_table_transform", "out", scores, page_table, lengths, k, row_starts,
                page_table_row_starts, row_to_batch, page_size, deterministic, nan_first, out, out_raw);
    return;
  }
  dsa_cuda_binding::topk_launch(f.call(k, deterministic, nan_first, page_size, &o, ptr(raw)));
}

Tensor topk_page_table_transform(Tensor scores, Tensor page_table, Tensor lengths, int64_t k, OptTensor row_starts,
                                 OptTensor page_table_row_starts, OptTensor row_to_batch, int64_t page_size,
                                 bool deterministic, bool nan_first) {
  const PageForm f(scores, page_table, lengths, row_starts, page_table_row_starts, row_to_batch, k, page_size);
  if (!f.ok) {
    return sd::to<Tensor>(call_router("topk_page_table_transform", "", scores, page_table, lengths, k, row_starts,
                                      page_table_row_starts, row_to_batch, page_size, deterministic, nan_first)[0]);
  }
  return launch_into_new_out(f.call(k, deterministic, nan_first, page_size, nullptr, nullptr));
}

Tensor topk_ragged_transform(Tensor scores, Tensor offsets, Tensor lengths, int64_t k, OptTensor row_starts,
                             bool nan_first) {
  const TensorInfo s = info_of(scores);
  const TensorInfo off = info_of(offsets);
  const std::optional<TensorInfo> len = info_of(lengths);
  const std::optional<TensorInfo> rs = info_of(row_starts);
  if (!(scores_ok(s, k, len, rs) && rows_ok(off, s))) {
    return sd::to<Tensor>(
        call_router("topk_ragged_transform", "", scores, offsets, lengths, k, row_starts, nan_first)[0]);
  }
  // The ragged form has no order flag: the filter kernel (any order), as providers_topk's ragged_fn.
  return launch_into_new_out(
      TopkCall{&s, k, ptr(len), ptr(rs), false, nullptr, nullptr, nullptr, 64, &off, nullptr, nullptr, nan_first});
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(DSA_TOPK_ROUTE_CONTROL_NS, m) {
  m.def("topk_route_set(int devices) -> ()");
  m.def("topk_route_error(str message) -> ()");
  m.def("topk_read_env() -> ()");
}

// CompositeExplicitAutograd: no tensor argument, so no dispatch key to pick a kernel by.
STABLE_TORCH_LIBRARY_IMPL(DSA_TOPK_ROUTE_CONTROL_NS, CompositeExplicitAutograd, m) {
  m.impl("topk_route_set", TORCH_BOX(&topk_route_set));
  m.impl("topk_route_error", TORCH_BOX(&topk_route_error));
  m.impl("topk_read_env", TORCH_BOX(&topk_read_env));
}

STABLE_TORCH_LIBRARY_IMPL(DSA_TOPK_ROUTE_NS, DSA_TOPK_ROUTE_KEY, m) {
  m.impl("topk", TORCH_BOX(&topk));
  m.impl("topk_page_table_transform", TORCH_BOX(&topk_page_table_transform));
  m.impl("topk_page_table_transform.out", TORCH_BOX(&topk_page_table_transform_out));
  m.impl("topk_ragged_transform", TORCH_BOX(&topk_ragged_transform));
}
