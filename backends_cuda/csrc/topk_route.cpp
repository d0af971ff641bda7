// The CUDA-key kernels of the top-k family's dsa ops (dsa::topk, dsa::topk_page_table_transform and its
// .out, dsa::topk_ragged_transform): no Python on the per-call path of the common call.
//
// A call that passes the fast check (the conditions under which the Python router would validate it,
// pick the cuda provider and find its `out` buffers fine) allocates `out` and launches through
// topk_out (csrc/topk.cpp). Any other call goes to the Python router, registered for the CUDA key of
// dsa_route::<op> (ops_core/_route.py), which gives today's result or error. The Python side also says
// which devices the fast path may serve (topk_route_set: the devices this library was built for, none
// while a backend other than cuda is forced) and hands over the router's error message
// (topk_route_error), which the stable ABI's dispatcher call does not pass back.
//
// benchmarks/host_overhead_cpu.py builds this file with the host compiler for the CPU key of its own
// namespaces (DSA_TOPK_ROUTE_CPU_TEST, a stub topk_out) to time the path without a GPU.
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

#include "topk_out.h"

#ifndef DSA_TOPK_ROUTE_CPU_TEST
#define DSA_TOPK_ROUTE_NS dsa
#define DSA_TOPK_ROUTE_KEY CUDA
#define DSA_TOPK_ROUTE_FALLBACK_NS dsa_route
#define DSA_TOPK_ROUTE_CONTROL_NS dsa_cuda
#endif

#define DSA_STR_(x) #x
#define DSA_STR(x) DSA_STR_(x)

namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;
using OptTensor = std::optional<Tensor>;

constexpr int64_t kInt32Max = 2147483647;
constexpr int64_t kMaxWidth = kInt32Max - 16;  // providers_topk.MAX_WIDTH

// Bit d: the fast path may serve tensors on cuda:d. 0 until Python sets it after the load, and while a
// backend other than cuda is forced. Read on every call, written rarely: relaxed is enough.
std::atomic<uint64_t> g_devices{0};

// The Python router's message for the last call it failed in this thread (see topk_route_error).
thread_local std::string t_router_error;

void topk_route_set(int64_t devices) { g_devices.store(static_cast<uint64_t>(devices), std::memory_order_relaxed); }

void topk_route_error(std::string message) { t_router_error = std::move(message); }

struct Device {
  int32_t type;
  int32_t index;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
};

Device device_of(const Tensor& t) {
  Device d{};
  aoti_torch_get_device_type(t.get(), &d.type);
  aoti_torch_get_device_index(t.get(), &d.index);
  return d;
}

bool served(const Device& d) {
#ifdef DSA_TOPK_ROUTE_CPU_TEST
  return d.type == aoti_torch_device_type_cpu() && g_devices.load(std::memory_order_relaxed) != 0;
#else
  return d.type == aoti_torch_device_type_cuda() && d.index >= 0 && d.index < 64 &&
         ((g_devices.load(std::memory_order_relaxed) >> d.index) & 1);
#endif
}

bool unit_last_stride(const Tensor& t) { return t.size(1) <= 1 || t.stride(1) == 1; }

// An int32 [rows] tensor on `dev` (Python's int32_rows_ok).
bool rows_ok(const Tensor& t, int64_t rows, const Device& dev) {
  return t.dim() == 1 && t.scalar_type() == ScalarType::Int && t.size(0) == rows && device_of(t) == dev;
}

bool rows_ok(const OptTensor& t, int64_t rows, const Device& dev) { return !t.has_value() || rows_ok(*t, rows, dev); }

// Python's scores_and_windows_ok and providers_topk._supports, on a served device.
bool scores_ok(const Tensor& scores, int64_t k, const OptTensor& lengths, const OptTensor& row_starts,
               const Device& dev) {
  if (!served(dev) || scores.dim() != 2 || k < 1 || k > kInt32Max) {
    return false;
  }
  const ScalarType st = scores.scalar_type();
  const int64_t rows = scores.size(0);
  return (st == ScalarType::Float || st == ScalarType::BFloat16 || st == ScalarType::Half) &&
         unit_last_stride(scores) && rows <= kInt32Max && scores.size(1) <= kMaxWidth &&
         rows_ok(lengths, rows, dev) && rows_ok(row_starts, rows, dev);
}

// The page-table form's other arguments (validate of topk_page_table_transform.py).
bool page_ok(const Tensor& scores, const Tensor& page_table, const OptTensor& page_table_row_starts,
             const OptTensor& row_to_batch, int64_t page_size, const Device& dev) {
  const int64_t rows = scores.size(0);
  return page_size >= 1 && (page_size & (page_size - 1)) == 0 && page_table.dim() == 2 &&
         page_table.scalar_type() == ScalarType::Int && unit_last_stride(page_table) &&
         device_of(page_table) == dev && rows_ok(page_table_row_starts, rows, dev) && rows_ok(row_to_batch, rows, dev);
}

// An int32 [rows, k] buffer with unit last stride on `dev` (Python's out_ok).
bool out_ok(const Tensor& out, const Tensor& scores, int64_t k, const Device& dev) {
  return out.dim() == 2 && out.scalar_type() == ScalarType::Int && out.size(0) == scores.size(0) &&
         out.size(1) == k && unit_last_stride(out) && device_of(out) == dev;
}

Tensor new_out(const Tensor& scores, int64_t k) {
  const int64_t size[2] = {scores.size(0), k};
  return torch::stable::new_empty(scores, {size, 2}, ScalarType::Int);
}

namespace sd = torch::stable::detail;  // from / to: StableIValue conversions

// Run the Python router, dsa_route::<op>, on these arguments and return the stack (results first). The
// stable dispatcher call turns the router's exception into an error code, so the message comes back
// through topk_route_error.
template <typename... Args>
std::array<StableIValue, sizeof...(Args)> call_router(const char* op, const char* overload, const Args&... args) {
  std::array<StableIValue, sizeof...(Args)> stack{sd::from(args)...};
  t_router_error.clear();
  const std::string name = std::string(DSA_STR(DSA_TOPK_ROUTE_FALLBACK_NS) "::") + op;
  if (torch_call_dispatcher(name.c_str(), overload, stack.data(), TORCH_ABI_VERSION) != TORCH_SUCCESS) {
    throw std::runtime_error(t_router_error.empty() ? name + " failed" : t_router_error);
  }
  return stack;
}

Tensor topk(Tensor scores, int64_t k, OptTensor lengths, OptTensor row_starts, bool deterministic) {
  const Device dev = device_of(scores);
  if (!scores_ok(scores, k, lengths, row_starts, dev)) {
    return sd::to<Tensor>(call_router("topk", "", scores, k, lengths, row_starts, deterministic)[0]);
  }
  Tensor out = new_out(scores, k);
  dsa_cuda_binding::topk_out(scores, k, lengths, row_starts, deterministic, std::nullopt, std::nullopt,
                             std::nullopt, 64, std::nullopt, out, std::nullopt);
  return out;
}

void topk_page_table_transform_out(Tensor scores, Tensor page_table, Tensor lengths, int64_t k, OptTensor row_starts,
                                   OptTensor page_table_row_starts, OptTensor row_to_batch, int64_t page_size,
                                   bool deterministic, Tensor out, OptTensor out_raw) {
  const Device dev = device_of(scores);
  if (!(scores_ok(scores, k, lengths, row_starts, dev) &&
        page_ok(scores, page_table, page_table_row_starts, row_to_batch, page_size, dev) &&
        out_ok(out, scores, k, dev) && (!out_raw.has_value() || out_ok(*out_raw, scores, k, dev)))) {
    call_router("topk_page_table_transform", "out", scores, page_table, lengths, k, row_starts,
                page_table_row_starts, row_to_batch, page_size, deterministic, out, out_raw);
    return;
  }
  dsa_cuda_binding::topk_out(scores, k, lengths, row_starts, deterministic, page_table, page_table_row_starts,
                             row_to_batch, page_size, std::nullopt, out, out_raw);
}

Tensor topk_page_table_transform(Tensor scores, Tensor page_table, Tensor lengths, int64_t k, OptTensor row_starts,
                                 OptTensor page_table_row_starts, OptTensor row_to_batch, int64_t page_size,
                                 bool deterministic) {
  const Device dev = device_of(scores);
  if (!(scores_ok(scores, k, lengths, row_starts, dev) &&
        page_ok(scores, page_table, page_table_row_starts, row_to_batch, page_size, dev))) {
    return sd::to<Tensor>(call_router("topk_page_table_transform", "", scores, page_table, lengths, k, row_starts,
                                      page_table_row_starts, row_to_batch, page_size, deterministic)[0]);
  }
  Tensor out = new_out(scores, k);
  dsa_cuda_binding::topk_out(scores, k, lengths, row_starts, deterministic, page_table, page_table_row_starts,
                             row_to_batch, page_size, std::nullopt, out, std::nullopt);
  return out;
}

Tensor topk_ragged_transform(Tensor scores, Tensor offsets, Tensor lengths, int64_t k, OptTensor row_starts) {
  const Device dev = device_of(scores);
  if (!(scores_ok(scores, k, lengths, row_starts, dev) && rows_ok(offsets, scores.size(0), dev))) {
    return sd::to<Tensor>(call_router("topk_ragged_transform", "", scores, offsets, lengths, k, row_starts)[0]);
  }
  Tensor out = new_out(scores, k);
  // The ragged form has no order flag: the ordered kernel, as providers_topk's ragged_fn.
  dsa_cuda_binding::topk_out(scores, k, lengths, row_starts, true, std::nullopt, std::nullopt, std::nullopt, 64,
                             offsets, out, std::nullopt);
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(DSA_TOPK_ROUTE_CONTROL_NS, m) {
  m.def("topk_route_set(int devices) -> ()");
  m.def("topk_route_error(str message) -> ()");
}

// CompositeExplicitAutograd: no tensor argument, so no dispatch key to pick a kernel by.
STABLE_TORCH_LIBRARY_IMPL(DSA_TOPK_ROUTE_CONTROL_NS, CompositeExplicitAutograd, m) {
  m.impl("topk_route_set", TORCH_BOX(&topk_route_set));
  m.impl("topk_route_error", TORCH_BOX(&topk_route_error));
}

STABLE_TORCH_LIBRARY_IMPL(DSA_TOPK_ROUTE_NS, DSA_TOPK_ROUTE_KEY, m) {
  m.impl("topk", TORCH_BOX(&topk));
  m.impl("topk_page_table_transform", TORCH_BOX(&topk_page_table_transform));
  m.impl("topk_page_table_transform.out", TORCH_BOX(&topk_page_table_transform_out));
  m.impl("topk_ragged_transform", TORCH_BOX(&topk_ragged_transform));
}
