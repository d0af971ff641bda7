// Torch binding of the top-k family for CUDA: torch.ops.dsa_cuda.topk_out, one entry for dsa.topk,
// dsa.topk_page_table_transform (page_table given) and dsa.topk_ragged_transform (offsets given). The
// dsa ops' own CUDA-key kernels (csrc/topk_route.cpp) call its unchecked core, topk_launch, after their
// own fast check (topk_out.h).
// Stable ABI only (build with -DUSE_CUDA for the stream shim and -DTORCH_TARGET_VERSION for the
// oldest torch to load under), so one binary loads under torch 2.11 through 2.14.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
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

using namespace dsa_binding;  // current_stream
using dsa_cuda_binding::info_of;
using dsa_cuda_binding::kBFloat16;
using dsa_cuda_binding::kFloat16;
using dsa_cuda_binding::kFloat32;
using dsa_cuda_binding::out_ok;
using dsa_cuda_binding::page_table_ok;
using dsa_cuda_binding::ptr;
using dsa_cuda_binding::rows_ok;
using dsa_cuda_binding::score_dtype_ok;
using dsa_cuda_binding::TensorInfo;

constexpr const char* kOp = "dsa_cuda.topk_out";
// The shim's device code of CUDA, asked once at load.
const int32_t kCuda = aoti_torch_device_type_cuda();

// dsa_binding::check_row_vector on the metadata read once (`scores` is on the device by then).
void check_row_vector(const std::optional<TensorInfo>& t, const char* name, const TensorInfo& scores) {
  STD_TORCH_CHECK(!t.has_value() || rows_ok(*t, scores), kOp, ": `", name,
                  "` must be an int32 [rows] tensor on the device of `scores`");
}

void check_out(const TensorInfo& t, const char* name, const TensorInfo& scores, int64_t k) {
  STD_TORCH_CHECK(out_ok(t, scores, k), kOp, ": `", name,
                  "` must be an int32 [rows, k] tensor with unit last stride and rows that do not overlap, on the "
                  "device of `scores`");
}

const int32_t* data_or_null(const TensorInfo* t) {
  if (t == nullptr) {
    return nullptr;
  }
  void* data = nullptr;
  aoti_torch_get_data_ptr(t->handle, &data);
  return static_cast<const int32_t*>(data);
}

int64_t stride_or_zero(const TensorInfo* t) { return t != nullptr ? t->stride(0) : 0; }

}  // namespace

void dsa_cuda_binding::topk_out(Tensor scores, int64_t k, std::optional<Tensor> lengths,
                                std::optional<Tensor> row_starts, bool deterministic, std::optional<Tensor> page_table,
                                std::optional<Tensor> page_table_row_starts, std::optional<Tensor> row_to_batch,
                                int64_t page_size, std::optional<Tensor> offsets, Tensor out,
                                std::optional<Tensor> out_raw, bool nan_first) {
  const TensorInfo s = info_of(scores);
  STD_TORCH_CHECK(s.dim == 2 && s.device_type == kCuda && s.unit_last_stride(), kOp,
                  ": `scores` must be a [rows, width] CUDA tensor with unit last stride");
  STD_TORCH_CHECK(score_dtype_ok(s.dtype), kOp,
                  ": `scores` must be float32, bfloat16 or float16");
  STD_TORCH_CHECK(k >= 1 && k <= INT32_MAX, kOp, ": `k` must be in [1, 2^31), got ", k);
  STD_TORCH_CHECK(s.size(0) <= INT32_MAX && s.size(1) <= INT32_MAX - 16, kOp,
                  ": `scores` must have fewer than 2^31 rows and 2^31 - 16 columns");
  const std::optional<TensorInfo> len = info_of(lengths);
  const std::optional<TensorInfo> rs = info_of(row_starts);
  const std::optional<TensorInfo> ptrs = info_of(page_table_row_starts);
  const std::optional<TensorInfo> rtb = info_of(row_to_batch);
  const std::optional<TensorInfo> off = info_of(offsets);
  check_row_vector(len, "lengths", s);
  check_row_vector(rs, "row_starts", s);
  check_row_vector(ptrs, "page_table_row_starts", s);
  check_row_vector(rtb, "row_to_batch", s);
  check_row_vector(off, "offsets", s);
  const TensorInfo o = info_of(out);
  check_out(o, "out", s, k);
  STD_TORCH_CHECK(!(page_table.has_value() && offsets.has_value()), kOp,
                  ": pass `page_table` (page-table form) or `offsets` (ragged form), not both");
  const std::optional<TensorInfo> pt = info_of(page_table);
  std::optional<TensorInfo> raw;
  if (pt.has_value()) {
    STD_TORCH_CHECK(page_table_ok(*pt, s), kOp, ": `page_table` must be an int32 [batches, max_pages] tensor with unit last stride");
    STD_TORCH_CHECK(page_size > 0 && (page_size & (page_size - 1)) == 0, kOp,
                    ": `page_size` must be a power of two, got ", page_size);
    if (out_raw.has_value()) {
      raw = info_of(*out_raw);
      check_out(*raw, "out_raw", s, k);
    }
  } else {
    STD_TORCH_CHECK(!out_raw.has_value(), kOp, ": `out_raw` is only for the page-table form");
  }
  topk_launch({&s, k, ptr(len), ptr(rs), deterministic, ptr(pt), ptr(ptrs), ptr(rtb), page_size, ptr(off), &o,
               ptr(raw), nan_first});
}

void dsa_cuda_binding::topk_launch(const TopkCall& c) {
  const TensorInfo& s = *c.scores;
  dsa_cuda::TopkParams p = {};
  void* scores_data = nullptr;
  aoti_torch_get_data_ptr(s.handle, &scores_data);
  p.scores = scores_data;
  p.dtype = s.dtype == kFloat32    ? dsa_cuda::TopkDtype::kFloat32
            : s.dtype == kBFloat16 ? dsa_cuda::TopkDtype::kBFloat16
                                   : dsa_cuda::TopkDtype::kFloat16;
  p.rows = s.size(0);
  p.width = s.size(1);
  p.row_stride = s.stride(0);
  p.k = c.k;
  p.deterministic = c.deterministic;
  p.nan_first = c.nan_first;
  p.lengths = data_or_null(c.lengths);
  p.lengths_stride = stride_or_zero(c.lengths);
  p.row_starts = data_or_null(c.row_starts);
  p.row_starts_stride = stride_or_zero(c.row_starts);
  p.out = const_cast<int32_t*>(data_or_null(c.out));
  p.out_stride = c.out->stride(0);
  p.mode = dsa_cuda::TopkMode::kPlain;
  p.page_size = 1;
  if (c.page_table != nullptr) {
    p.mode = dsa_cuda::TopkMode::kPageTable;
    p.page_table = data_or_null(c.page_table);
    p.batches = c.page_table->size(0);
    p.max_pages = c.page_table->size(1);
    p.page_table_stride = c.page_table->stride(0);
    p.row_to_batch = data_or_null(c.row_to_batch);
    p.row_to_batch_stride = stride_or_zero(c.row_to_batch);
    p.page_table_row_starts = data_or_null(c.page_table_row_starts);
    p.page_table_row_starts_stride = stride_or_zero(c.page_table_row_starts);
    p.page_size = c.page_size;
    if (c.out_raw != nullptr) {
      p.out_raw = const_cast<int32_t*>(data_or_null(c.out_raw));
      p.out_raw_stride = c.out_raw->stride(0);
    }
  } else if (c.offsets != nullptr) {
    p.mode = dsa_cuda::TopkMode::kRagged;
    p.offsets = data_or_null(c.offsets);
    p.offsets_stride = stride_or_zero(c.offsets);
  }

  // The launcher queries the current device and torch's stream belongs to the tensors' device.
  const int32_t device = s.device_index;
  dsa_binding::DeviceScope on_device(device);
  void* stream = current_stream(kOp, device);
  const cudaError_t err = dsa_cuda::launch_topk(p, static_cast<cudaStream_t>(stream));
  STD_TORCH_CHECK(err == cudaSuccess, kOp, ": kernel launch failed: ", cudaGetErrorString(err));
}

STABLE_TORCH_LIBRARY_FRAGMENT(dsa_cuda, m) {
  m.def(
      "topk_out(Tensor scores, int k, Tensor? lengths, Tensor? row_starts, bool deterministic, "
      "Tensor? page_table, Tensor? page_table_row_starts, Tensor? row_to_batch, int page_size, "
      "Tensor? offsets, Tensor(a!) out, Tensor(b!)? out_raw, bool nan_first=False) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(dsa_cuda, CUDA, m) { m.impl("topk_out", TORCH_BOX(&dsa_cuda_binding::topk_out)); }
