// Torch binding of dsa.sparse_attention for CUDA (fp8 e4m3 caches): torch.ops.dsa_cuda.sparse_attention_out.
// Stable ABI only (build with -DUSE_CUDA and -DTORCH_TARGET_VERSION), so one binary loads under torch 2.11
// through 2.14.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>
#include <tuple>

#include "dsa_binding.h"
#include "dsa_cuda/smxx_sparse_attention_heuristics.cuh"
#include "dsa_cuda/sparse_attention.cuh"
#include "sparse_attention_out.h"

namespace {

using namespace dsa_binding;  // is_int32, current_stream, DeviceScope, ...
using torch::headeronly::ScalarType;

constexpr const char* kOp = "dsa_cuda.sparse_attention_out";

bool on(const Tensor& t, int32_t device) { return t.is_cuda() && t.get_device_index() == device; }

bool fp8_cache(const Tensor& c, int32_t device, int64_t d) {
  return c.dim() == 4 && c.scalar_type() == ScalarType::Float8_e4m3fn && on(c, device) && c.size(3) == d &&
         c.stride(3) == 1;
}

// torch.ops.dsa_cuda.sparse_attention_split_plan: the route's split plan, for the test that it is Python's.
std::tuple<int64_t, int64_t> sparse_attention_split_plan(int64_t rows, int64_t kv_heads, int64_t topk, int64_t sms) {
  const auto plan = dsa_cuda::sparse_attention_heuristics::split_plan(rows, kv_heads, topk, sms);
  return {plan.splits, plan.whole};
}

}  // namespace

void dsa_cuda_binding::sparse_attention_out(Tensor q, Tensor k_cache, Tensor v_cache, Tensor indices,
                                            Tensor block_table, Tensor token_to_req, double softmax_scale,
                                            double k_scale, double v_scale, int64_t splits, int64_t whole,
                                            int64_t cta_warps, Tensor out, Tensor workspace) {
  STD_TORCH_CHECK(q.dim() == 3 && q.is_cuda() && q.scalar_type() == ScalarType::BFloat16 && q.size(2) == 128 &&
                      q.stride(2) == 1,
                  kOp, ": `q` must be a bfloat16 [T, Hq, 128] CUDA tensor with unit last stride");
  const int32_t device = q.get_device_index();
  const int64_t t = q.size(0), hq = q.size(1);
  STD_TORCH_CHECK(fp8_cache(k_cache, device, 128) && fp8_cache(v_cache, device, 128) &&
                      v_cache.size(0) == k_cache.size(0) && v_cache.size(1) == k_cache.size(1) &&
                      v_cache.size(2) == k_cache.size(2),
                  kOp, ": `k_cache` and `v_cache` must be float8_e4m3fn [num_blocks, P, Hkv, 128] tensors on q's "
                  "device with unit last stride");
  STD_TORCH_CHECK(indices.dim() == 2 && indices.size(0) == t && is_int32(indices) && on(indices, device), kOp,
                  ": `indices` must be an int32 [T, topk] tensor on q's device");
  STD_TORCH_CHECK(block_table.dim() == 2 && is_int32(block_table) && on(block_table, device), kOp,
                  ": `block_table` must be an int32 [num_requests, max_pages] tensor on q's device");
  STD_TORCH_CHECK(token_to_req.dim() == 1 && token_to_req.size(0) == t && is_int32(token_to_req) &&
                      on(token_to_req, device),
                  kOp, ": `token_to_req` must be an int32 [T] tensor on q's device");
  STD_TORCH_CHECK(out.dim() == 3 && out.size(0) == t && out.size(1) == hq && out.size(2) == 128 &&
                      out.scalar_type() == ScalarType::BFloat16 && on(out, device) && out.stride(2) == 1,
                  kOp, ": `out` must be a bfloat16 [T, Hq, 128] tensor with unit last stride on q's device");
  STD_TORCH_CHECK(splits >= 1, kOp, ": `splits` must be >= 1, got ", splits);
  STD_TORCH_CHECK(whole >= 0, kOp, ": `whole` must be >= 0, got ", whole);
  STD_TORCH_CHECK(cta_warps == 0 || cta_warps == 4 || cta_warps == 16, kOp,
                  ": `cta_warps` must be 0 (the launcher's rule), 4 or 16, got ", cta_warps);
  const int64_t hkv = k_cache.size(2);
  const int64_t need = dsa_cuda::sparse_attention_workspace_floats(t, hkv, splits, whole);
  STD_TORCH_CHECK(workspace.scalar_type() == ScalarType::Float && on(workspace, device) && workspace.is_contiguous() &&
                      workspace.numel() >= need,
                  kOp, ": `workspace` must be a contiguous float32 tensor on q's device of at least ", need,
                  " elements for ", splits, " splits");

  dsa_cuda::SparseAttentionParams p;
  p.q = q.data_ptr();
  p.k_cache = k_cache.data_ptr();
  p.v_cache = v_cache.data_ptr();
  p.indices = static_cast<const int32_t*>(indices.data_ptr());
  p.block_table = static_cast<const int32_t*>(block_table.data_ptr());
  p.token_to_req = static_cast<const int32_t*>(token_to_req.data_ptr());
  p.out = out.data_ptr();
  p.workspace = static_cast<float*>(workspace.data_ptr());
  p.rows = t;
  p.q_heads = hq;
  p.kv_heads = hkv;
  p.topk = indices.size(1);
  p.num_blocks = k_cache.size(0);
  p.page_size = k_cache.size(1);
  p.num_reqs = block_table.size(0);
  p.max_pages = block_table.size(1);
  p.q_row_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.k_block_stride = k_cache.stride(0);
  p.k_page_stride = k_cache.stride(1);
  p.k_head_stride = k_cache.stride(2);
  p.v_block_stride = v_cache.stride(0);
  p.v_page_stride = v_cache.stride(1);
  p.v_head_stride = v_cache.stride(2);
  p.idx_row_stride = indices.stride(0);
  p.idx_pos_stride = indices.stride(1);
  p.bt_req_stride = block_table.stride(0);
  p.bt_page_stride = block_table.stride(1);
  p.t2r_stride = token_to_req.stride(0);
  p.out_row_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.k_scale = static_cast<float>(k_scale);
  p.v_scale = static_cast<float>(v_scale);
  p.splits = splits;
  p.whole = whole;
  p.cta_warps = cta_warps;
  if (t == 0 || hq == 0) {
    return;
  }
  const char* why = dsa_cuda::sparse_attention_unsupported(p);
  STD_TORCH_CHECK(why == nullptr, kOp, ": ", why);

  dsa_binding::DeviceScope on_device(device);
  void* stream = current_stream(kOp, device);
  const cudaError_t err = dsa_cuda::launch_sparse_attention(p, static_cast<cudaStream_t>(stream));
  STD_TORCH_CHECK(err != cudaErrorNotSupported, kOp,
                  ": the CUDA sparse attention kernel runs on compute capability 9.x and 10.x GPUs only");
  STD_TORCH_CHECK(err == cudaSuccess, kOp, ": kernel launch failed: ", cudaGetErrorString(err));
}

STABLE_TORCH_LIBRARY_FRAGMENT(dsa_cuda, m) {
  m.def(
      "sparse_attention_out(Tensor q, Tensor k_cache, Tensor v_cache, Tensor indices, Tensor block_table, "
      "Tensor token_to_req, float softmax_scale, float k_scale, float v_scale, int splits, int whole, int cta_warps, "
      "Tensor(a!) out, Tensor(b!) workspace) -> ()");
  m.def("sparse_attention_split_plan(int rows, int kv_heads, int topk, int sms) -> (int, int)");
}

STABLE_TORCH_LIBRARY_IMPL(dsa_cuda, CUDA, m) {
  m.impl("sparse_attention_out", TORCH_BOX(&dsa_cuda_binding::sparse_attention_out));
}

// CompositeExplicitAutograd: no tensor argument, so no dispatch key to pick a kernel by.
STABLE_TORCH_LIBRARY_IMPL(dsa_cuda, CompositeExplicitAutograd, m) {
  m.impl("sparse_attention_split_plan", TORCH_BOX(&sparse_attention_split_plan));
}
