// The CUDA-key kernel of dsa::sparse_mla_decode: no Python on the per-call path of the common call.
//
// A call that passes the fast check (the conditions under which the Python router would validate it, pick the
// cuda provider and the binding accept it) allocates out, lse and the split workspace and launches through
// the binding entry (csrc/sparse_mla_decode.cpp) with the provider's split rule and variant. Any other call goes
// to the Python router, dsa_route::sparse_mla_decode (ops_core/_route.py), which gives today's result or error.
// Python says which devices the fast path may serve (sparse_mla_decode_route_set: where the cuda provider is
// registered, available and serves the arch, none while another backend is forced;
// providers_sparse_mla_decode.take_route).
//
// Host time of an eager call, H100 host (benchmarks/bench_sparse_mla_decode.py -k test_sparse_mla_decode_op):
// 46.7-61.3 us through the Python router and launcher, 16.5-18.4 here; FlashMLA's sparse_decode_fwd 31.7-39.4.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

#include "dsa_cuda/smxx_sparse_mla_decode_heuristics.cuh"
#include "route_common.h"
#include "sparse_mla_decode_out.h"

// tests/test_mla_route_gate_cpu.py builds this file for the CPU key of its own namespaces (DSA_MLA_ROUTE_CPU_TEST,
// a stub binding entry) to check the fast check against the Python router's decision without a GPU.
#ifndef DSA_MLA_ROUTE_CPU_TEST
#include "route_device.h"
#define DSA_MLA_ROUTE_NS dsa
#define DSA_MLA_ROUTE_KEY CUDA
#define DSA_MLA_ROUTE_FALLBACK_NS dsa_route
#define DSA_MLA_ROUTE_CONTROL_NS dsa_cuda
#endif

namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;
using OptTensor = std::optional<Tensor>;
namespace heur = dsa_cuda::sparse_mla_decode_heuristics;
using dsa_route_common::aligned16;
using dsa_route_common::empty_contiguous;
using dsa_route_common::same_device;

#ifdef DSA_MLA_ROUTE_CPU_TEST
dsa_route_common::ServedDevices g_served{aoti_torch_device_type_cpu()};
int sm_count(int32_t) { return 132; }
int cc_major(int32_t) { return 9; }
#else
dsa_route_common::ServedDevices g_served{aoti_torch_device_type_cuda()};
using dsa_route_common::cc_major;
using dsa_route_common::sm_count;
#endif

void sparse_mla_decode_route_set(int64_t devices) {
  g_served.mask.store(static_cast<uint64_t>(devices), std::memory_order_relaxed);
}

// Python's validate (ops_core/ops/sparse_mla_decode.py), providers_sparse_mla_decode.unsupported_shape and the
// binding's checks, for q on a served device; false sends the call to the router.
bool fast_ok(const Tensor& q, const Tensor& kv, const Tensor& indices, bool v4, const OptTensor& topk_lens,
             const OptTensor& attn_sink) {
  if (!g_served.serves(q)) {
    return false;
  }
  const int64_t d = v4 ? 512 : 576, bpt = v4 ? 584 : 656;
  if (!(q.dim() == 4 && q.scalar_type() == ScalarType::BFloat16 && q.size(3) == d && q.stride(3) == 1 &&
        aligned16(q) && q.stride(0) % 8 == 0 && q.stride(1) % 8 == 0 && q.stride(2) % 8 == 0)) {
    return false;
  }
  const int64_t b = q.size(0), s_q = q.size(1), h = q.size(2);
  if (h <= 0 || h % heur::kHeadsPerCta != 0) {
    return false;
  }
  if (!(kv.dim() == 4 && kv.scalar_type() == ScalarType::Byte && same_device(kv, q) && kv.size(2) == 1 &&
        kv.size(3) == bpt && kv.stride(3) == 1 && kv.stride(1) == bpt && aligned16(kv))) {
    return false;
  }
  const int64_t nb = kv.size(0), page = kv.size(1);
  if (page < 1 || page > (int64_t{1} << 20) || (nb > 1 && (kv.stride(0) < page * bpt || kv.stride(0) % 16 != 0))) {
    return false;
  }
  if (!(indices.dim() == 3 && indices.scalar_type() == ScalarType::Int && same_device(indices, q) && indices.size(0) == b &&
        indices.size(1) == s_q && indices.size(2) < (int64_t{1} << 31) - 1 - 2 * heur::kTile)) {
    return false;
  }
  if (b * s_q * (h / heur::kHeadsPerCta) * heur::kMaxSplits >= (int64_t{1} << 31)) {
    return false;
  }
  if (topk_lens.has_value() && !(topk_lens->dim() == 1 && topk_lens->scalar_type() == ScalarType::Int &&
                                 same_device(*topk_lens, q) && topk_lens->size(0) == b)) {
    return false;
  }
  return !attn_sink.has_value() || (attn_sink->dim() == 1 && attn_sink->scalar_type() == ScalarType::Float &&
                                    same_device(*attn_sink, q) && attn_sink->size(0) == h && (h <= 1 || attn_sink->stride(0) == 1));
}

std::tuple<Tensor, Tensor> sparse_mla_decode(Tensor q, Tensor kv_cache, Tensor indices, double softmax_scale,
                                             std::string layout, OptTensor topk_lens, OptTensor attn_sink) {
  const bool v4 = layout == "v4";
  if (!((v4 || layout == "v32") && fast_ok(q, kv_cache, indices, v4, topk_lens, attn_sink))) {
    auto stack = dsa_route_common::call_router(DSA_ROUTE_STR(DSA_MLA_ROUTE_FALLBACK_NS) "::sparse_mla_decode", "", q,
                                               kv_cache, indices, softmax_scale, layout, topk_lens, attn_sink);
    return {torch::stable::detail::to<Tensor>(stack[0]), torch::stable::detail::to<Tensor>(stack[1])};
  }
  const int32_t dev = q.get_device_index();
  const int64_t b = q.size(0), s_q = q.size(1), h = q.size(2), topk = indices.size(2);
  const int64_t splits = heur::split_count(b, s_q, h, topk, sm_count(dev));
  // providers_sparse_mla_decode.variant_for: the three-role kernel on SM90, variant 0 elsewhere.
  const int64_t variant = cc_major(dev) == 9 ? 3 : 0;
  Tensor out = empty_contiguous({b, s_q, h, 512}, aoti_torch_dtype_bfloat16(), g_served.type, dev);
  Tensor lse = empty_contiguous({b, h, s_q}, aoti_torch_dtype_float32(), g_served.type, dev);
  Tensor ws = empty_contiguous({heur::workspace_floats(b, s_q, h, splits)}, aoti_torch_dtype_float32(), g_served.type,
                               dev);
  dsa_cuda_binding::sparse_mla_decode_out(q, kv_cache, indices, topk_lens, attn_sink, softmax_scale, v4, splits, out,
                                          lse, ws, variant);
  return {out, lse};
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(DSA_MLA_ROUTE_CONTROL_NS, m) { m.def("sparse_mla_decode_route_set(int devices) -> ()"); }

// CompositeExplicitAutograd: no tensor argument, so no dispatch key to pick a kernel by.
STABLE_TORCH_LIBRARY_IMPL(DSA_MLA_ROUTE_CONTROL_NS, CompositeExplicitAutograd, m) {
  m.impl("sparse_mla_decode_route_set", TORCH_BOX(&sparse_mla_decode_route_set));
}

STABLE_TORCH_LIBRARY_IMPL(DSA_MLA_ROUTE_NS, DSA_MLA_ROUTE_KEY, m) {
  m.impl("sparse_mla_decode", TORCH_BOX(&sparse_mla_decode));
}
