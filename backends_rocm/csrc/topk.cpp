// Torch binding of the native HIP top-k family: torch.ops.dsa_hip.topk_out, one entry for dsa.topk,
// dsa.topk_page_table_transform (page_table given) and dsa.topk_ragged_transform (offsets given).
// `split` workgroups per row (> 1: the row-split path, with `workspace` sized by the caller from the
// shapes: topk_workspace_words). Built by hipcc on ROCm torch, and on NVIDIA by the host compiler with
// -DDSA_HIP_ON_CUDA (the kernels then come from nvcc through dsa_hip/hip_compat.h).
// Stable ABI only (build with -DUSE_CUDA for the stream shim, which ROCm torch exports under the same
// name, and -DTORCH_TARGET_VERSION for the oldest torch to load under).
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>
#include <optional>

#include "dsa_binding.h"
#include "dsa_hip/topk.h"

namespace {

using namespace dsa_binding;  // is_int32, unit_last_stride, check_row_vector, ptr_or_null, ...
using torch::headeronly::ScalarType;

constexpr const char* kOp = "dsa_hip.topk_out";

void check_out(const Tensor& t, const char* name, const Tensor& scores, int64_t k) {
  STD_TORCH_CHECK(t.dim() == 2 && t.size(0) == scores.size(0) && t.size(1) == k && is_int32(t) && t.is_cuda() &&
                      t.get_device_index() == scores.get_device_index() && unit_last_stride(t),
                  kOp, ": `", name, "` must be an int32 [rows, k] tensor with unit last stride on the device of `scores`");
}

void topk_out(Tensor scores, int64_t k, std::optional<Tensor> lengths, std::optional<Tensor> row_starts,
              bool deterministic, std::optional<Tensor> page_table, std::optional<Tensor> page_table_row_starts,
              std::optional<Tensor> row_to_batch, int64_t page_size, std::optional<Tensor> offsets, Tensor out,
              std::optional<Tensor> out_raw, int64_t split, std::optional<Tensor> workspace, bool nan_first) {
  (void)deterministic;  // every output row is in ascending index order
  STD_TORCH_CHECK(scores.dim() == 2 && scores.is_cuda() && unit_last_stride(scores), kOp,
                  ": `scores` must be a [rows, width] GPU tensor with unit last stride");
  const ScalarType st = scores.scalar_type();
  dsa_hip::TopkDtype dtype;
  if (st == ScalarType::Float) {
    dtype = dsa_hip::TopkDtype::kFloat32;
  } else if (st == ScalarType::BFloat16) {
    dtype = dsa_hip::TopkDtype::kBFloat16;
  } else if (st == ScalarType::Half) {
    dtype = dsa_hip::TopkDtype::kFloat16;
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
  STD_TORCH_CHECK(split >= 1 && split <= dsa_hip::kTopkMaxSplit, kOp, ": `split` must be in [1, ",
                  dsa_hip::kTopkMaxSplit, "], got ", split);
  uint32_t* ws = nullptr;
  if (split > 1) {
    STD_TORCH_CHECK(workspace.has_value() && workspace->is_cuda() && workspace->get_device_index() == device &&
                        workspace->is_contiguous() && workspace->element_size() == 4 &&
                        workspace->numel() >= dsa_hip::topk_workspace_words(scores.size(0), split),
                    kOp, ": split > 1 needs a contiguous 4-byte `workspace` of at least ",
                    dsa_hip::topk_workspace_words(scores.size(0), split), " elements on the device of `scores`");
    ws = static_cast<uint32_t*>(workspace->data_ptr());
  }

  dsa_hip::TopkParams p = {};
  p.scores = scores.data_ptr();
  p.dtype = dtype;
  p.rows = scores.size(0);
  p.width = scores.size(1);
  p.row_stride = scores.stride(0);
  p.k = k;
  p.nan_first = nan_first;
  p.lengths = ptr_or_null(lengths);
  p.lengths_stride = stride_or_zero(lengths);
  p.row_starts = ptr_or_null(row_starts);
  p.row_starts_stride = stride_or_zero(row_starts);
  p.out = static_cast<int32_t*>(out.data_ptr());
  p.out_stride = out.stride(0);
  p.mode = dsa_hip::TopkMode::kPlain;
  p.page_size = 1;
  p.split = int32_t(split);
  p.workspace = ws;
  if (page_table.has_value()) {
    STD_TORCH_CHECK(page_table->dim() == 2 && is_int32(*page_table) && page_table->is_cuda() &&
                        page_table->get_device_index() == device && unit_last_stride(*page_table),
                    kOp, ": `page_table` must be an int32 [batches, max_pages] tensor with unit last stride");
    STD_TORCH_CHECK(page_size > 0 && (page_size & (page_size - 1)) == 0, kOp,
                    ": `page_size` must be a power of two, got ", page_size);
    p.mode = dsa_hip::TopkMode::kPageTable;
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
      p.mode = dsa_hip::TopkMode::kRagged;
      p.offsets = ptr_or_null(offsets);
      p.offsets_stride = stride_or_zero(offsets);
    }
  }

  // The launcher queries the current device and torch's stream belongs to the tensors' device.
  dsa_binding::DeviceScope on_device(device);
  void* stream = current_stream(kOp, device);
  const hipError_t err = dsa_hip::launch_topk(p, static_cast<hipStream_t>(stream));
  STD_TORCH_CHECK(err == hipSuccess, kOp, ": kernel launch failed: ", hipGetErrorString(err));
}

}  // namespace

// A fragment: every op's binding file adds its own schema to the one dsa_hip namespace.
STABLE_TORCH_LIBRARY_FRAGMENT(dsa_hip, m) {
  m.def(
      "topk_out(Tensor scores, int k, Tensor? lengths, Tensor? row_starts, bool deterministic, "
      "Tensor? page_table, Tensor? page_table_row_starts, Tensor? row_to_batch, int page_size, "
      "Tensor? offsets, Tensor(a!) out, Tensor(b!)? out_raw, int split, Tensor? workspace, "
      "bool nan_first=False) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(dsa_hip, CUDA, m) { m.impl("topk_out", TORCH_BOX(&topk_out)); }
