// Torch binding of dsa.paged_indexer_logits for CUDA: torch.ops.dsa_cuda.paged_indexer_logits_out.
// Stable ABI only (build with -DUSE_CUDA and -DTORCH_TARGET_VERSION), so one binary loads under
// torch 2.11 through 2.14.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>

#include "dsa_binding.h"
#include "dsa_cuda/paged_indexer_logits.cuh"
#include "paged_indexer_logits_out.h"

namespace {

using namespace dsa_binding;  // is_int32, unit_last_stride, current_stream, ...
using torch::headeronly::ScalarType;

constexpr const char* kOp = "dsa_cuda.paged_indexer_logits_out";

bool on(const Tensor& t, int32_t device) { return t.is_cuda() && t.get_device_index() == device; }

}  // namespace

void dsa_cuda_binding::paged_indexer_logits_out(Tensor q, Tensor kv_cache, Tensor weights, Tensor context_lens,
                                                Tensor block_table, int64_t max_context_len, bool clean,
                                                bool fp8_mma, int64_t config, Tensor out) {
  STD_TORCH_CHECK(q.dim() == 4 && q.is_cuda() && q.scalar_type() == ScalarType::Float8_e4m3fn && unit_last_stride(q),
                  kOp, ": `q` must be a float8_e4m3fn [B, next_n, H, D] CUDA tensor with unit last stride");
  const int32_t device = q.get_device_index();
  const int64_t b = q.size(0), next_n = q.size(1), h = q.size(2), d = q.size(3);
  STD_TORCH_CHECK(kv_cache.dim() == 4 && kv_cache.scalar_type() == ScalarType::Byte && on(kv_cache, device) &&
                      kv_cache.size(1) == 64 && kv_cache.size(2) == 1 && kv_cache.size(3) == d + 4 &&
                      (kv_cache.size(0) == 0 || (kv_cache.stride(3) == 1 && kv_cache.stride(1) == d + 4)),
                  kOp, ": `kv_cache` must be a uint8 [num_blocks, 64, 1, D + 4] tensor on q's device, blocks "
                  "contiguous inside");
  STD_TORCH_CHECK(weights.dim() == 2 && weights.size(0) == b * next_n && weights.size(1) == h &&
                      weights.scalar_type() == ScalarType::Float && on(weights, device),
                  kOp, ": `weights` must be a float32 [B * next_n, H] tensor on q's device");
  STD_TORCH_CHECK(context_lens.dim() == 1 && context_lens.size(0) == b && is_int32(context_lens) &&
                      on(context_lens, device),
                  kOp, ": `context_lens` must be an int32 [B] tensor on q's device");
  STD_TORCH_CHECK(block_table.dim() == 2 && block_table.size(0) == b && is_int32(block_table) &&
                      on(block_table, device),
                  kOp, ": `block_table` must be an int32 [B, max_blocks] tensor on q's device");
  STD_TORCH_CHECK(max_context_len >= 0, kOp, ": `max_context_len` must be >= 0");
  STD_TORCH_CHECK(out.dim() == 2 && out.size(0) == b * next_n && out.size(1) == max_context_len &&
                      out.scalar_type() == ScalarType::Float && on(out, device) && unit_last_stride(out),
                  kOp, ": `out` must be a float32 [B * next_n, max_context_len] tensor with unit last stride on "
                  "q's device");

  dsa_cuda::PagedIndexerLogitsParams p;
  p.q = q.data_ptr();
  p.kv_cache = kv_cache.data_ptr();
  p.weights = static_cast<const float*>(weights.data_ptr());
  p.context_lens = static_cast<const int32_t*>(context_lens.data_ptr());
  p.block_table = static_cast<const int32_t*>(block_table.data_ptr());
  p.out = static_cast<float*>(out.data_ptr());
  p.batch = b;
  p.next_n = next_n;
  p.heads = h;
  p.head_dim = d;
  p.max_context_len = max_context_len;
  p.num_blocks = kv_cache.size(0);
  p.max_blocks = block_table.size(1);
  p.q_batch_stride = q.stride(0);
  p.q_token_stride = q.stride(1);
  p.q_head_stride = q.stride(2);
  p.block_stride = kv_cache.size(0) > 0 ? kv_cache.stride(0) : 0;
  p.weights_row_stride = weights.stride(0);
  p.weights_head_stride = weights.stride(1);
  p.context_lens_stride = context_lens.stride(0);
  p.block_table_row_stride = block_table.stride(0);
  p.block_table_col_stride = block_table.stride(1);
  p.out_row_stride = out.stride(0);
  p.fp8_mma = fp8_mma;
  p.clean = clean;
  STD_TORCH_CHECK(config >= 0 && config <= 299, kOp, ": `config` must be in [0, 299] (3 decimal digits), got ",
                  config);
  p.config = static_cast<int32_t>(config);
  if (b == 0 || next_n == 0 || max_context_len == 0) {
    return;
  }
  const char* why = dsa_cuda::paged_indexer_logits_unsupported(p);
  STD_TORCH_CHECK(why == nullptr, kOp, ": ", why);

  dsa_binding::DeviceScope on_device(device);
  void* stream = current_stream(kOp, device);
  const cudaError_t err = dsa_cuda::launch_paged_indexer_logits(p, static_cast<cudaStream_t>(stream));
  STD_TORCH_CHECK(err != cudaErrorNotSupported, kOp,
                  ": the CUDA paged indexer kernel runs on SM90 (Hopper) GPUs only (wgmma)");
  STD_TORCH_CHECK(err == cudaSuccess, kOp, ": kernel launch failed: ", cudaGetErrorString(err));
}

STABLE_TORCH_LIBRARY_FRAGMENT(dsa_cuda, m) {
  m.def(
      "paged_indexer_logits_out(Tensor q, Tensor kv_cache, Tensor weights, Tensor context_lens, "
      "Tensor block_table, int max_context_len, bool clean, bool fp8_mma, int config, Tensor(a!) out) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(dsa_cuda, CUDA, m) {
  m.impl("paged_indexer_logits_out", TORCH_BOX(&dsa_cuda_binding::paged_indexer_logits_out));
}
