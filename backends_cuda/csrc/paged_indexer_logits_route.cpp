// The CUDA-key kernel of dsa::paged_indexer_logits: no Python on the per-call path of the common call.
//
// A call that passes the fast check (the conditions under which the Python router would validate it, pick the
// cuda provider, whose rule names CUDA for every paged call, and the binding accept it) allocates the scores and
// launches through the binding entry (csrc/paged_indexer_logits.cpp) with the launcher's default config. Any
// other call goes to the Python router, dsa_route::paged_indexer_logits (ops_core/_route.py), which gives today's
// result or error. Python says which devices the fast path may serve (paged_indexer_logits_route_set:
// providers_paged_indexer.take_route).
//
// tests/test_paged_route_gate_cpu.py builds this file for the CPU key of its own namespaces
// (DSA_PAGED_ROUTE_CPU_TEST, a stub binding entry) to check the fast check against the Python path's decision.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>

#include "paged_indexer_logits_out.h"
#include "route_common.h"

#ifndef DSA_PAGED_ROUTE_CPU_TEST
#define DSA_PAGED_ROUTE_NS dsa
#define DSA_PAGED_ROUTE_KEY CUDA
#define DSA_PAGED_ROUTE_FALLBACK_NS dsa_route
#define DSA_PAGED_ROUTE_CONTROL_NS dsa_cuda
#endif

namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;
using dsa_route_common::aligned16;
using dsa_route_common::empty_contiguous;
using dsa_route_common::same_device;

constexpr int64_t kBlock = 64;  // positions a cache block
constexpr int64_t kTile = 128;  // output positions a tile (providers_paged_indexer._TILE)

#ifdef DSA_PAGED_ROUTE_CPU_TEST
dsa_route_common::ServedDevices g_served{aoti_torch_device_type_cpu()};
#else
dsa_route_common::ServedDevices g_served{aoti_torch_device_type_cuda()};
#endif

void paged_indexer_logits_route_set(int64_t devices) {
  g_served.mask.store(static_cast<uint64_t>(devices), std::memory_order_relaxed);
}

// Python's validate (ops_core/ops/paged_indexer_logits.py), providers_paged_indexer.unsupported_shape and the
// binding's checks, for q on a served device; false sends the call to the router.
bool fast_ok(const Tensor& q, const Tensor& kv, const Tensor& w, const Tensor& lens, const Tensor& bt,
             int64_t max_context_len) {
  if (!g_served.serves(q)) {
    return false;
  }
  if (!(q.dim() == 4 && q.scalar_type() == ScalarType::Float8_e4m3fn && q.size(3) == 128 && q.stride(3) == 1 &&
        aligned16(q) && q.stride(0) % 16 == 0 && q.stride(1) % 16 == 0 && q.stride(2) % 16 == 0)) {
    return false;
  }
  const int64_t b = q.size(0), next_n = q.size(1), h = q.size(2), d = q.size(3);
  if (!(h == 32 || h == 64) || next_n > 1024 || b * next_n >= (int64_t{1} << 28)) {
    return false;
  }
  if (!(kv.dim() == 4 && kv.scalar_type() == ScalarType::Byte && same_device(kv, q) && kv.size(1) == kBlock &&
        kv.size(2) == 1 && kv.size(3) == d + 4 && kv.stride(3) == 1 && kv.stride(1) == d + 4)) {
    return false;
  }
  const int64_t nb = kv.size(0);
  if (nb >= (int64_t{1} << 31) - 1 || (nb > 0 && !(aligned16(kv) && kv.stride(0) % 16 == 0))) {
    return false;
  }
  if (!(w.dim() == 2 && w.scalar_type() == ScalarType::Float && same_device(w, q) && w.size(0) == b * next_n &&
        w.size(1) == h)) {
    return false;
  }
  if (!(lens.dim() == 1 && lens.scalar_type() == ScalarType::Int && same_device(lens, q) && lens.size(0) == b)) {
    return false;
  }
  if (!(bt.dim() == 2 && bt.scalar_type() == ScalarType::Int && same_device(bt, q) && bt.size(0) == b)) {
    return false;
  }
  return max_context_len >= 0 && max_context_len <= (int64_t{1} << 31) - 1 - 8 * kTile &&
         b * next_n * ((max_context_len + kTile - 1) / kTile) < (int64_t{1} << 35);
}

Tensor paged_indexer_logits(Tensor q, Tensor kv_cache, Tensor weights, Tensor context_lens, Tensor block_table,
                            int64_t max_context_len, bool clean, bool precise) {
  if (!fast_ok(q, kv_cache, weights, context_lens, block_table, max_context_len)) {
    return torch::stable::detail::to<Tensor>(dsa_route_common::call_router(
        DSA_ROUTE_STR(DSA_PAGED_ROUTE_FALLBACK_NS) "::paged_indexer_logits", "", q, kv_cache, weights, context_lens,
        block_table, max_context_len, clean, precise)[0]);
  }
  Tensor out = empty_contiguous({q.size(0) * q.size(1), max_context_len}, aoti_torch_dtype_float32(), g_served.type,
                                q.get_device_index());
  dsa_cuda_binding::paged_indexer_logits_out(q, kv_cache, weights, context_lens, block_table, max_context_len, clean,
                                             !precise, 0, out);
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(DSA_PAGED_ROUTE_CONTROL_NS, m) {
  m.def("paged_indexer_logits_route_set(int devices) -> ()");
}

// CompositeExplicitAutograd: no tensor argument, so no dispatch key to pick a kernel by.
STABLE_TORCH_LIBRARY_IMPL(DSA_PAGED_ROUTE_CONTROL_NS, CompositeExplicitAutograd, m) {
  m.impl("paged_indexer_logits_route_set", TORCH_BOX(&paged_indexer_logits_route_set));
}

STABLE_TORCH_LIBRARY_IMPL(DSA_PAGED_ROUTE_NS, DSA_PAGED_ROUTE_KEY, m) {
  m.impl("paged_indexer_logits", TORCH_BOX(&paged_indexer_logits));
}
