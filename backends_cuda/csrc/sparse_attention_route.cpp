// The CUDA-key kernels of dsa::sparse_attention and its .out form: no Python on the per-call path of the
// common eager call.
//
// A call that passes the fast check (the conditions under which the Python router would validate it, find its
// `out` fine, pick the cuda provider and the binding accept it) allocates `out` (the functional form) and the
// split workspace and launches through the binding entry (csrc/sparse_attention.cpp) with the provider's split
// plan. Any other call goes to the Python router, dsa_route::sparse_attention[.out] (ops_core/_route.py), which
// gives today's result or error; so does a call of at most 63 rows x KV heads inside a CUDA-graph capture,
// where the op's rule (ops_core/ops/sparse_attention.py, `prefer`) may pick Triton's split-K kernel. Python
// says which devices the fast path may serve (sparse_attention_route_set; providers_sparse_attention.take_route).
//
// tests/test_sa_route_gate_cpu.py builds this file for the CPU key of its own namespaces
// (DSA_SA_ROUTE_CPU_TEST, a stub binding entry) to check the fast check against the Python path's decision.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <utility>

#include "dsa_cuda/smxx_sparse_attention_heuristics.cuh"
#include "route_common.h"
#include "sparse_attention_out.h"

#ifndef DSA_SA_ROUTE_CPU_TEST
#include "route_device.h"
#define DSA_SA_ROUTE_NS dsa
#define DSA_SA_ROUTE_KEY CUDA
#define DSA_SA_ROUTE_FALLBACK_NS dsa_route
#define DSA_SA_ROUTE_CONTROL_NS dsa_cuda
#endif

namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;
namespace heur = dsa_cuda::sparse_attention_heuristics;
using dsa_route_common::aligned16;
using dsa_route_common::empty_contiguous;
using dsa_route_common::same_device;

constexpr int64_t kInt31 = int64_t{1} << 31;
constexpr int64_t kTritonMaxPrograms = 63;  // ops_core/ops/sparse_attention.py TRITON_MAX_PROGRAMS

#ifdef DSA_SA_ROUTE_CPU_TEST
dsa_route_common::ServedDevices g_served{aoti_torch_device_type_cpu()};
int sm_count(int32_t) { return 132; }
bool capturing(const Tensor&) { return false; }
#else
dsa_route_common::ServedDevices g_served{aoti_torch_device_type_cuda()};
using dsa_route_common::sm_count;

// Whether torch's current stream on q's device is capturing a CUDA graph.
bool capturing(const Tensor& q) {
  void* stream = nullptr;
  if (aoti_torch_get_current_cuda_stream(q.get_device_index(), &stream) != AOTI_TORCH_SUCCESS) {
    return true;  // unknown: the router decides
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status) != cudaSuccess ||
         status != cudaStreamCaptureStatusNone;
}
#endif

void sparse_attention_route_set(int64_t devices) {
  g_served.mask.store(static_cast<uint64_t>(devices), std::memory_order_relaxed);
}

// An fp8 e4m3 [num_blocks, P, Hkv, 128] cache on q's device with unit last stride, 16-byte aligned data and
// block / token / head strides (providers_sparse_attention.unsupported_shape).
bool cache_ok(const Tensor& c, const Tensor& q) {
  return c.dim() == 4 && c.scalar_type() == ScalarType::Float8_e4m3fn && same_device(c, q) && c.size(3) == heur::kHeadDim &&
         c.stride(3) == 1 && aligned16(c) && c.stride(0) % 16 == 0 && c.stride(1) % 16 == 0 && c.stride(2) % 16 == 0;
}

bool int32_on(const Tensor& t, const Tensor& q, int64_t dim) {
  return t.dim() == dim && t.scalar_type() == ScalarType::Int && same_device(t, q);
}

// Python's validate (ops_core/ops/sparse_attention.py), the cuda provider's unsupported_shape and the binding's
// checks, for q on a served device, and the op's rule outside a capture; false sends the call to the router.
bool inputs_ok(const Tensor& q, const Tensor& kc, const Tensor& vc, const Tensor& idx, const Tensor& bt,
               const Tensor& t2r) {
  if (!g_served.serves(q)) {
    return false;
  }
  if (!(q.dim() == 3 && q.scalar_type() == ScalarType::BFloat16 && q.size(2) == heur::kHeadDim && q.stride(2) == 1 &&
        aligned16(q) && q.stride(0) % 8 == 0 && q.stride(1) % 8 == 0)) {
    return false;
  }
  const int64_t t = q.size(0), hq = q.size(1);
  if (!(cache_ok(kc, q) && cache_ok(vc, q) && vc.size(0) == kc.size(0) && vc.size(1) == kc.size(1) &&
        vc.size(2) == kc.size(2))) {
    return false;
  }
  const int64_t nb = kc.size(0), page = kc.size(1), hkv = kc.size(2);
  if (page <= 0 || hkv <= 0 || hq % hkv != 0 || hq / hkv > heur::kMaxGroup || nb >= kInt31) {
    return false;
  }
  if (!(int32_on(idx, q, 2) && idx.size(0) == t && idx.size(1) < (int64_t{1} << 30))) {
    return false;
  }
  if (!(int32_on(bt, q, 2) && bt.size(0) < kInt31 && bt.size(1) * page < kInt31)) {
    return false;
  }
  if (!(int32_on(t2r, q, 1) && t2r.size(0) == t && t * hkv * heur::kMaxSplits < kInt31)) {
    return false;
  }
  return !(t * hkv <= kTritonMaxPrograms && capturing(q));
}

int64_t element_size(const Tensor& t) {
  switch (t.scalar_type()) {
    case ScalarType::Float8_e4m3fn:
      return 1;
    case ScalarType::BFloat16:
      return 2;
    default:
      return 4;  // int32: what the fast check admits besides
  }
}

// Bytes [first, one past the last) of t's elements; {0, 0} when it has none (Python's _byte_span).
std::pair<uintptr_t, uintptr_t> byte_span(const Tensor& t) {
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 0) {
      return {0, 0};
    }
    last += (t.size(d) - 1) * t.stride(d);
  }
  const auto lo = reinterpret_cast<uintptr_t>(t.data_ptr());
  return {lo, lo + static_cast<uintptr_t>((last + 1) * element_size(t))};
}

// check_out and check_out_alone of the .out form: a bf16 [T, Hq, 128] buffer on q's device with unit last stride
// whose elements do not overlap each other nor any input.
bool out_ok(const Tensor& out, const std::array<const Tensor*, 6>& inputs) {
  const Tensor& q = *inputs[0];
  if (!(out.dim() == 3 && out.scalar_type() == ScalarType::BFloat16 && same_device(out, q) && out.size(0) == q.size(0) &&
        out.size(1) == q.size(1) && out.size(2) == heur::kHeadDim && out.stride(2) == 1)) {
    return false;
  }
  std::array<std::pair<int64_t, int64_t>, 3> dims{};  // (stride, size) of the dims of more than one element
  int n = 0;
  for (int64_t d = 0; d < 3; ++d) {
    if (out.size(d) > 1) {
      dims[n++] = {out.stride(d), out.size(d)};
    }
  }
  std::sort(dims.begin(), dims.begin() + n);
  int64_t reach = 0;
  for (int i = 0; i < n; ++i) {
    if (dims[i].first <= reach) {
      return false;
    }
    reach += (dims[i].second - 1) * dims[i].first;
  }
  const auto o = byte_span(out);
  if (o.first == o.second) {
    return true;
  }
  for (const Tensor* t : inputs) {
    const auto s = byte_span(*t);
    if (s.first != s.second && s.first < o.second && o.first < s.second) {
      return false;
    }
  }
  return true;
}

// The launch into `out` with the provider's split plan and a workspace of its size.
void launch(const Tensor& q, const Tensor& kc, const Tensor& vc, const Tensor& idx, const Tensor& bt,
            const Tensor& t2r, double softmax_scale, double k_scale, double v_scale, const Tensor& out) {
  const int32_t dev = q.get_device_index();
  const int64_t hkv = kc.size(2);
  const auto plan = heur::split_plan(q.size(0), hkv, idx.size(1), sm_count(dev));
  Tensor ws = empty_contiguous({heur::workspace_floats(q.size(0), hkv, plan.splits, plan.whole)},
                               aoti_torch_dtype_float32(), g_served.type, dev);
  dsa_cuda_binding::sparse_attention_out(q, kc, vc, idx, bt, t2r, softmax_scale, k_scale, v_scale, plan.splits,
                                         plan.whole, 0, out, ws);
}

const std::string kRouter = DSA_ROUTE_STR(DSA_SA_ROUTE_FALLBACK_NS) "::sparse_attention";

Tensor sparse_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor indices, Tensor block_table,
                        Tensor token_to_req, double softmax_scale, double k_scale, double v_scale) {
  if (!inputs_ok(q, k_cache, v_cache, indices, block_table, token_to_req)) {
    return torch::stable::detail::to<Tensor>(dsa_route_common::call_router(
        kRouter, "", q, k_cache, v_cache, indices, block_table, token_to_req, softmax_scale, k_scale, v_scale)[0]);
  }
  Tensor out = empty_contiguous({q.size(0), q.size(1), heur::kHeadDim}, aoti_torch_dtype_bfloat16(), g_served.type,
                                q.get_device_index());
  launch(q, k_cache, v_cache, indices, block_table, token_to_req, softmax_scale, k_scale, v_scale, out);
  return out;
}

void sparse_attention_out(Tensor q, Tensor k_cache, Tensor v_cache, Tensor indices, Tensor block_table,
                          Tensor token_to_req, double softmax_scale, double k_scale, double v_scale, Tensor out) {
  if (!(inputs_ok(q, k_cache, v_cache, indices, block_table, token_to_req) &&
        out_ok(out, {&q, &k_cache, &v_cache, &indices, &block_table, &token_to_req}))) {
    dsa_route_common::call_router(kRouter, "out", q, k_cache, v_cache, indices, block_table, token_to_req,
                                  softmax_scale, k_scale, v_scale, out);
    return;
  }
  launch(q, k_cache, v_cache, indices, block_table, token_to_req, softmax_scale, k_scale, v_scale, out);
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(DSA_SA_ROUTE_CONTROL_NS, m) { m.def("sparse_attention_route_set(int devices) -> ()"); }

// CompositeExplicitAutograd: no tensor argument, so no dispatch key to pick a kernel by.
STABLE_TORCH_LIBRARY_IMPL(DSA_SA_ROUTE_CONTROL_NS, CompositeExplicitAutograd, m) {
  m.impl("sparse_attention_route_set", TORCH_BOX(&sparse_attention_route_set));
}

STABLE_TORCH_LIBRARY_IMPL(DSA_SA_ROUTE_NS, DSA_SA_ROUTE_KEY, m) {
  m.impl("sparse_attention", TORCH_BOX(&sparse_attention));
  m.impl("sparse_attention.out", TORCH_BOX(&sparse_attention_out));
}
