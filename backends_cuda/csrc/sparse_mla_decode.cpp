// Torch binding of dsa.sparse_mla_decode for CUDA: torch.ops.dsa_cuda.sparse_mla_decode_out.
// Stable ABI only (build with -DUSE_CUDA and -DTORCH_TARGET_VERSION), so one binary loads under
// torch 2.11 through 2.14.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>
#include <optional>

#include "dsa_binding.h"
#include "dsa_cuda/smxx_sparse_mla_decode_heuristics.cuh"
#include "dsa_cuda/sparse_mla_decode.cuh"
#include "sparse_mla_decode_out.h"

namespace {

using namespace dsa_binding;  // is_int32, unit_last_stride, current_stream, ...
using torch::headeronly::ScalarType;

constexpr const char* kOp = "dsa_cuda.sparse_mla_decode_out";

bool on(const Tensor& t, int32_t device) { return t.is_cuda() && t.get_device_index() == device; }

// torch.ops.dsa_cuda.sparse_mla_decode_split_count: the route's split rule, for the test that it is Python's.
int64_t sparse_mla_decode_split_count(int64_t batch, int64_t s_q, int64_t heads, int64_t topk, int64_t sms) {
  return dsa_cuda::sparse_mla_decode_heuristics::split_count(batch, s_q, heads, topk, sms);
}

}  // namespace

void dsa_cuda_binding::sparse_mla_decode_out(Tensor q, Tensor kv_cache, Tensor indices,
                                             std::optional<Tensor> topk_lens, std::optional<Tensor> attn_sink,
                                             double softmax_scale, bool v4, int64_t splits, Tensor out, Tensor lse,
                                             Tensor workspace, int64_t variant) {
  const int64_t d = v4 ? 512 : 576;
  const int64_t bpt = v4 ? 584 : 656;
  STD_TORCH_CHECK(q.dim() == 4 && q.is_cuda() && q.scalar_type() == ScalarType::BFloat16 && q.size(3) == d &&
                      q.stride(3) == 1,
                  kOp, ": `q` must be a bfloat16 [B, s_q, H, ", d, "] CUDA tensor with unit last stride");
  const int32_t device = q.get_device_index();
  const int64_t b = q.size(0), s_q = q.size(1), h = q.size(2);
  STD_TORCH_CHECK(kv_cache.dim() == 4 && kv_cache.scalar_type() == ScalarType::Byte && on(kv_cache, device) &&
                      kv_cache.size(2) == 1 && kv_cache.size(3) == bpt &&
                      (kv_cache.size(0) == 0 ||
                       (kv_cache.stride(3) == 1 && kv_cache.stride(1) == bpt &&
                        (kv_cache.size(0) == 1 || kv_cache.stride(0) >= kv_cache.size(1) * bpt))),
                  kOp, ": `kv_cache` must be a uint8 [num_blocks, P, 1, ", bpt,
                  "] tensor on q's device, pages contiguous inside and not overlapping");
  STD_TORCH_CHECK(indices.dim() == 3 && indices.size(0) == b && indices.size(1) == s_q && is_int32(indices) &&
                      on(indices, device),
                  kOp, ": `indices` must be an int32 [B, s_q, topk] tensor on q's device");
  if (topk_lens.has_value()) {
    STD_TORCH_CHECK(topk_lens->dim() == 1 && topk_lens->size(0) == b && is_int32(*topk_lens) && on(*topk_lens, device),
                    kOp, ": `topk_lens` must be an int32 [B] tensor on q's device");
  }
  if (attn_sink.has_value()) {
    STD_TORCH_CHECK(attn_sink->dim() == 1 && attn_sink->size(0) == h &&
                        attn_sink->scalar_type() == ScalarType::Float && on(*attn_sink, device) &&
                        (h <= 1 || attn_sink->stride(0) == 1),
                    kOp, ": `attn_sink` must be a contiguous float32 [H] tensor on q's device");
  }
  STD_TORCH_CHECK(out.dim() == 4 && out.size(0) == b && out.size(1) == s_q && out.size(2) == h && out.size(3) == 512 &&
                      out.scalar_type() == ScalarType::BFloat16 && on(out, device) && out.stride(3) == 1,
                  kOp, ": `out` must be a bfloat16 [B, s_q, H, 512] tensor with unit last stride on q's device");
  STD_TORCH_CHECK(lse.dim() == 3 && lse.size(0) == b && lse.size(1) == h && lse.size(2) == s_q &&
                      lse.scalar_type() == ScalarType::Float && on(lse, device) && lse.is_contiguous(),
                  kOp, ": `lse` must be a contiguous float32 [B, H, s_q] tensor on q's device");
  STD_TORCH_CHECK(splits >= 1, kOp, ": `splits` must be >= 1, got ", splits);
  STD_TORCH_CHECK(variant == 0 || variant == 3, kOp,
                  ": `variant` must be 0 or 3 (the three-role kernel, SM90 only), got ", variant);
  const int64_t need = dsa_cuda::sparse_mla_decode_workspace_floats(b, s_q, h, splits);
  STD_TORCH_CHECK(workspace.scalar_type() == ScalarType::Float && on(workspace, device) && workspace.is_contiguous() &&
                      workspace.numel() >= need,
                  kOp, ": `workspace` must be a contiguous float32 tensor on q's device of at least ", need,
                  " elements for ", splits, " splits");

  dsa_cuda::SparseMlaDecodeParams p;
  p.q = q.data_ptr();
  p.kv_cache = kv_cache.data_ptr();
  p.indices = static_cast<const int32_t*>(indices.data_ptr());
  p.topk_lens = topk_lens.has_value() ? static_cast<const int32_t*>(topk_lens->data_ptr()) : nullptr;
  p.attn_sink = attn_sink.has_value() ? static_cast<const float*>(attn_sink->data_ptr()) : nullptr;
  p.out = out.data_ptr();
  p.lse = static_cast<float*>(lse.data_ptr());
  p.workspace = static_cast<float*>(workspace.data_ptr());
  p.batch = b;
  p.s_q = s_q;
  p.heads = h;
  p.topk = indices.size(2);
  p.num_blocks = kv_cache.size(0);
  p.page_size = kv_cache.size(1);
  p.page_stride = kv_cache.size(0) > 1 ? kv_cache.stride(0) : kv_cache.size(1) * bpt;
  p.q_batch_stride = q.stride(0);
  p.q_token_stride = q.stride(1);
  p.q_head_stride = q.stride(2);
  p.idx_batch_stride = indices.stride(0);
  p.idx_token_stride = indices.stride(1);
  p.idx_pos_stride = indices.stride(2);
  p.out_batch_stride = out.stride(0);
  p.out_token_stride = out.stride(1);
  p.out_head_stride = out.stride(2);
  p.topk_lens_stride = topk_lens.has_value() ? topk_lens->stride(0) : 0;
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.v4 = v4;
  p.splits = splits;
  p.variant = variant;
  if (b == 0 || s_q == 0 || h == 0) {
    return;
  }
  const char* why = dsa_cuda::sparse_mla_decode_unsupported(p);
  STD_TORCH_CHECK(why == nullptr, kOp, ": ", why);

  dsa_binding::DeviceScope on_device(device);
  void* stream = current_stream(kOp, device);
  const cudaError_t err = dsa_cuda::launch_sparse_mla_decode(p, static_cast<cudaStream_t>(stream));
  STD_TORCH_CHECK(err != cudaErrorNotSupported, kOp,
                  ": the CUDA sparse MLA decode kernel runs on SM90 (Hopper) GPUs only (wgmma)");
  STD_TORCH_CHECK(err == cudaSuccess, kOp, ": kernel launch failed: ", cudaGetErrorString(err));
}

STABLE_TORCH_LIBRARY_FRAGMENT(dsa_cuda, m) {
  m.def(
      "sparse_mla_decode_out(Tensor q, Tensor kv_cache, Tensor indices, Tensor? topk_lens, Tensor? attn_sink, "
      "float softmax_scale, bool v4, int splits, Tensor(a!) out, Tensor(b!) lse, Tensor(c!) workspace, "
      "int variant=0) -> ()");
  m.def("sparse_mla_decode_split_count(int batch, int s_q, int heads, int topk, int sms) -> int");
}

STABLE_TORCH_LIBRARY_IMPL(dsa_cuda, CUDA, m) {
  m.impl("sparse_mla_decode_out", TORCH_BOX(&dsa_cuda_binding::sparse_mla_decode_out));
}

// CompositeExplicitAutograd: no tensor argument, so no dispatch key to pick a kernel by.
STABLE_TORCH_LIBRARY_IMPL(dsa_cuda, CompositeExplicitAutograd, m) {
  m.impl("sparse_mla_decode_split_count", TORCH_BOX(&sparse_mla_decode_split_count));
}
