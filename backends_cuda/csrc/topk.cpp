// Torch binding of the top-k family for CUDA: torch.ops.dsa_cuda.topk_out, one entry for dsa.topk,
// dsa.topk_page_table_transform (page_table given) and dsa.topk_ragged_transform (offsets given). The
// dsa ops' own CUDA-key kernels (csrc/topk_route.cpp) call it too (topk_out.h).
// Stable ABI only (build with -DUSE_CUDA for the stream shim and -DTORCH_TARGET_VERSION for the
// oldest torch to load under), so one binary loads under torch 2.11 through 2.14.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>
#include <optional>

#include "dsa_binding.h"
#include "dsa_cuda/topk.cuh"
#include "topk_out.h"

namespace {

using namespace dsa_binding;  // is_int32, unit_last_stride, check_row_vector, ptr_or_null, ...
using torch::headeronly::ScalarType;

constexpr const char* kOp = "dsa_cuda.topk_out";

void check_out(const Tensor& t, const char* name, const Tensor& scores, int64_t k) {
  STD_TORCH_CHECK(t.dim() == 2 && t.size(0) == scores.size(0) && t.size(1) == k && is_int32(t) && t.is_cuda() &&
                      t.get_device_index() == scores.get_device_index() && unit_last_stride(t),
                  kOp, ": `", name, "` must be an int32 [rows, k] tensor with unit last stride on the device of `scores`");
}

}  // namespace

void dsa_cuda_binding::topk_out(Tensor scores, int64_t k, std::optional<Tensor> lengths,
                                std::optional<Tensor> row_starts, bool deterministic, std::optional<Tensor> page_table,
                                std::optional<Tensor> page_table_row_starts, std::optional<Tensor> row_to_batch,
                                int64_t page_size, std::optional<Tensor> offsets, Tensor out,
                                std::optional<Tensor> out_raw) {
  STD_TORCH_CHECK(scores.dim() == 2 && scores.is_cuda() && unit_last_stride(scores), kOp,
                  ": `scores` must be a [rows, width] CUDA tensor with unit last stride");
  const ScalarType st = scores.scalar_type();
  dsa_cuda::TopkDtype dtype;
  if (st == ScalarType::Float) {
    dtype = dsa_cuda::TopkDtype::kFloat32;
  } else if (st == ScalarType::BFloat16) {
    dtype = dsa_cuda::TopkDtype::kBFloat16;
  } else if (st == ScalarType::Half) {
    dtype = dsa_cuda::TopkDtype::kFloat16;
  } else {
    STD_TORCH_CHECK(false, kOp, ": `scores` must be float32, bfloat16 or float16");
  }
  STD_TORCH_CHECK(k >= 1 && k <= INT32_MAX, kOp, ": `k` must be in [1, 2^31), got ", k);
  STD_TORCH_CHECK(scores.size(0) <= INT32_MAX && scores.size(1) <= INT32_MAX - 16, kOp,
                  ": `scores` must have fewer than 2^31 rows and 2^31 - 16 columns");
  check_row_vector(kOp, lengths, "lengths", scores, "scores");
  check_row_vector(kOp, row_starts, "row_starts", scores, "scores");
  check_row_vector(kOp, page_table_row_starts, "page_table_row_starts", scores, "scores");
  check_row_vector(kOp, row_to_batch, "row_to_batch", scores, "scores");
  check_row_vector(kOp, offsets, "offsets", scores, "scores");
  check_out(out, "out", scores, k);
  STD_TORCH_CHECK(!(page_table.has_value() && offsets.has_value()), kOp,
                  ": pass `page_table` (page-table form) or `offsets` (ragged form), not both");
  const int32_t device = scores.get_device_index();

  dsa_cuda::TopkParams p = {};
  p.scores = scores.data_ptr();
  p.dtype = dtype;
  p.rows = scores.size(0);
  p.width = scores.size(1);
  p.row_stride = scores.stride(0);
  p.k = k;
  p.deterministic = deterministic;
  p.lengths = ptr_or_null(lengths);
  p.lengths_stride = stride_or_zero(lengths);
  p.row_starts = ptr_or_null(row_starts);
  p.row_starts_stride = stride_or_zero(row_starts);
  p.out = static_cast<int32_t*>(out.data_ptr());
  p.out_stride = out.stride(0);
  p.mode = dsa_cuda::TopkMode::kPlain;
  p.page_size = 1;
  if (page_table.has_value()) {
    STD_TORCH_CHECK(page_table->dim() == 2 && is_int32(*page_table) && page_table->is_cuda() &&
                        page_table->get_device_index() == device && unit_last_stride(*page_table),
                    kOp, ": `page_table` must be an int32 [batches, max_pages] tensor with unit last stride");
    STD_TORCH_CHECK(page_size > 0 && (page_size & (page_size - 1)) == 0, kOp,
                    ": `page_size` must be a power of two, got ", page_size);
    p.mode = dsa_cuda::TopkMode::kPageTable;
    p.page_table = static_cast<const int32_t*>(page_table->data_ptr());
    p.batches = page_table->size(0);
    p.max_pages = page_table->size(1);
    p.page_table_stride = page_table->stride(0);
    p.row_to_batch = ptr_or_null(row_to_batch);
    p.row_to_batch_stride = stride_or_zero(row_to_batch);
    p.page_table_row_starts = ptr_or_null(page_table_row_starts);
    p.page_table_row_starts_stride = stride_or_zero(page_table_row_starts);
    p.page_size = page_size;
    if (out_raw.has_value()) {
      check_out(*out_raw, "out_raw", scores, k);
      p.out_raw = static_cast<int32_t*>(out_raw->data_ptr());
      p.out_raw_stride = out_raw->stride(0);
    }
  } else {
    STD_TORCH_CHECK(!out_raw.has_value(), kOp, ": `out_raw` is only for the page-table form");
    if (offsets.has_value()) {
      p.mode = dsa_cuda::TopkMode::kRagged;
      p.offsets = ptr_or_null(offsets);
      p.offsets_stride = stride_or_zero(offsets);
    }
  }

  // The launcher queries the current device and torch's stream belongs to the tensors' device.
  torch::stable::accelerator::DeviceGuard guard(device);
  void* stream = current_stream(kOp, device);
  const cudaError_t err = dsa_cuda::launch_topk(p, static_cast<cudaStream_t>(stream));
  STD_TORCH_CHECK(err == cudaSuccess, kOp, ": kernel launch failed: ", cudaGetErrorString(err));
}

STABLE_TORCH_LIBRARY_FRAGMENT(dsa_cuda, m) {
  m.def(
      "topk_out(Tensor scores, int k, Tensor? lengths, Tensor? row_starts, bool deterministic, "
      "Tensor? page_table, Tensor? page_table_row_starts, Tensor? row_to_batch, int page_size, "
      "Tensor? offsets, Tensor(a!) out, Tensor(b!)? out_raw) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(dsa_cuda, CUDA, m) { m.impl("topk_out", TORCH_BOX(&dsa_cuda_binding::topk_out)); }
