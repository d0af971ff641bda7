// Torch binding of dsa.indexer_logits for CUDA: torch.ops.dsa_cuda.indexer_logits_out.
// Stable ABI only (build with -DUSE_CUDA and -DTORCH_TARGET_VERSION), so one binary loads under
// torch 2.11 through 2.14.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>
#include <optional>

#include "dsa_binding.h"
#include "dsa_cuda/indexer_logits.cuh"

namespace {

using namespace dsa_binding;  // is_int32, unit_last_stride, check_row_vector, current_stream, ...
using torch::headeronly::ScalarType;

constexpr const char* kOp = "dsa_cuda.indexer_logits_out";

void indexer_logits_out(Tensor q, Tensor kv, std::optional<Tensor> kv_scale, Tensor weights, Tensor ks, Tensor ke,
                        bool clean, bool fp8_mma, int64_t config, Tensor out) {
  STD_TORCH_CHECK(q.dim() == 3 && q.is_cuda() && unit_last_stride(q), kOp,
                  ": `q` must be a [T, H, D] CUDA tensor with unit last stride");
  const int32_t device = q.get_device_index();
  const ScalarType st = q.scalar_type();
  STD_TORCH_CHECK(st == ScalarType::Float8_e4m3fn || st == ScalarType::BFloat16, kOp,
                  ": `q` must be float8_e4m3fn or bfloat16");
  const bool fp8 = st == ScalarType::Float8_e4m3fn;
  const int64_t t = q.size(0), h = q.size(1), d = q.size(2);
  STD_TORCH_CHECK(kv.dim() == 2 && kv.size(1) == d && kv.scalar_type() == st && kv.is_cuda() &&
                      kv.get_device_index() == device && unit_last_stride(kv),
                  kOp, ": `kv` must be a [N, D] tensor of q's dtype and device with unit last stride");
  const int64_t n = kv.size(0);
  if (fp8) {
    STD_TORCH_CHECK(kv_scale.has_value() && kv_scale->dim() == 1 && kv_scale->size(0) == n &&
                        kv_scale->scalar_type() == ScalarType::Float && kv_scale->is_cuda() &&
                        kv_scale->get_device_index() == device,
                    kOp, ": fp8 keys need a float32 [N] `kv_scale` on q's device");
  } else {
    STD_TORCH_CHECK(!kv_scale.has_value(), kOp, ": `kv_scale` must be None for bfloat16 operands");
  }
  STD_TORCH_CHECK(weights.dim() == 2 && weights.size(0) == t && weights.size(1) == h &&
                      weights.scalar_type() == ScalarType::Float && weights.is_cuda() &&
                      weights.get_device_index() == device,
                  kOp, ": `weights` must be a float32 [T, H] tensor on q's device");
  check_row_vector(kOp, ks, "ks", q, "q");
  check_row_vector(kOp, ke, "ke", q, "q");
  STD_TORCH_CHECK(out.dim() == 2 && out.size(0) == t && out.size(1) == n && out.scalar_type() == ScalarType::Float &&
                      out.is_cuda() && out.get_device_index() == device && unit_last_stride(out),
                  kOp, ": `out` must be a float32 [T, N] tensor with unit last stride on q's device");

  dsa_cuda::IndexerLogitsParams p;
  p.q = q.data_ptr();
  p.kv = kv.data_ptr();
  p.kv_scale = fp8 ? static_cast<const float*>(kv_scale->data_ptr()) : nullptr;
  p.weights = static_cast<const float*>(weights.data_ptr());
  p.ks = static_cast<const int32_t*>(ks.data_ptr());
  p.ke = static_cast<const int32_t*>(ke.data_ptr());
  p.out = static_cast<float*>(out.data_ptr());
  p.rows = t;
  p.keys = n;
  p.heads = h;
  p.head_dim = d;
  p.q_row_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.kv_row_stride = kv.stride(0);
  p.kv_scale_stride = fp8 ? kv_scale->stride(0) : 0;
  p.weights_row_stride = weights.stride(0);
  p.weights_head_stride = weights.stride(1);
  p.ks_stride = ks.stride(0);
  p.ke_stride = ke.stride(0);
  p.out_row_stride = out.stride(0);
  p.dtype = fp8 ? dsa_cuda::IndexerDtype::kFp8E4m3 : dsa_cuda::IndexerDtype::kBf16;
  p.fp8_mma = fp8_mma;
  p.clean = clean;
  STD_TORCH_CHECK(config >= 0 && config <= 4, kOp,
                  ": `config` must be 0 (default), 1 or 2 (TMA key tiles, 4 or 3 math warpgroups), 3 (cp.async key "
                  "tiles) or 4 (TMA key tiles, exact mode), got ", config);
  p.config = static_cast<int32_t>(config);
  if (t == 0 || n == 0) {
    return;
  }
  const char* why = dsa_cuda::indexer_logits_unsupported(p);
  STD_TORCH_CHECK(why == nullptr, kOp, ": ", why);

  dsa_binding::DeviceScope on_device(device);
  void* stream = current_stream(kOp, device);
  const cudaError_t err = dsa_cuda::launch_indexer_logits(p, static_cast<cudaStream_t>(stream));
  STD_TORCH_CHECK(err != cudaErrorNotSupported, kOp,
                  ": the CUDA indexer kernels run on SM90 (wgmma) and, for fp8 operands with fp8 MMAs, config 0 and "
                  "q heads 128 bytes apart, on the SM100 family (tcgen05, compiled, not run)");
  STD_TORCH_CHECK(err == cudaSuccess, kOp, ": kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(dsa_cuda, m) {
  m.def(
      "indexer_logits_out(Tensor q, Tensor kv, Tensor? kv_scale, Tensor weights, Tensor ks, Tensor ke, "
      "bool clean, bool fp8_mma, int config, Tensor(a!) out) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(dsa_cuda, CUDA, m) {
  m.impl("indexer_logits_out", TORCH_BOX(&indexer_logits_out));
}
