// Torch binding of dsa.page_table_transform for CUDA: torch.ops.dsa_cuda.page_table_transform_out.
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
#include "dsa_cuda/page_table_transform.cuh"

namespace {

using namespace dsa_binding;  // is_int32, unit_last_stride, check_row_vector, ptr_or_null, ...

constexpr const char* kOp = "dsa_cuda.page_table_transform_out";

void page_table_transform_out(Tensor indices, Tensor page_table, std::optional<Tensor> row_to_batch,
                              std::optional<Tensor> page_table_row_starts, int64_t page_size, Tensor out) {
  STD_TORCH_CHECK(indices.dim() == 2 && is_int32(indices) && indices.is_cuda() && indices.is_contiguous(), kOp,
                  ": `indices` must be a contiguous int32 [rows, k] CUDA tensor");
  const int32_t device = indices.get_device_index();
  STD_TORCH_CHECK(out.dim() == 2 && out.size(0) == indices.size(0) && out.size(1) == indices.size(1) &&
                      is_int32(out) && out.is_cuda() && out.get_device_index() == device && out.is_contiguous(),
                  kOp, ": `out` must be a contiguous int32 tensor shaped like `indices`, on its device");
  STD_TORCH_CHECK(page_table.dim() == 2 && is_int32(page_table) && page_table.is_cuda() &&
                      page_table.get_device_index() == device &&
                      (page_table.size(1) <= 1 || page_table.stride(1) == 1),
                  kOp, ": `page_table` must be an int32 [batches, max_pages] tensor with unit last stride");
  check_row_vector(kOp, row_to_batch, "row_to_batch", indices, "indices");
  check_row_vector(kOp, page_table_row_starts, "page_table_row_starts", indices, "indices");
  STD_TORCH_CHECK(page_size > 0 && (page_size & (page_size - 1)) == 0, kOp,
                  ": `page_size` must be a power of two, got ", page_size);

  dsa_cuda::PageTableTransformParams p;
  p.indices = static_cast<const int32_t*>(indices.data_ptr());
  p.out = static_cast<int32_t*>(out.data_ptr());
  p.page_table = static_cast<const int32_t*>(page_table.data_ptr());
  p.row_to_batch = ptr_or_null(row_to_batch);
  p.page_table_row_starts = ptr_or_null(page_table_row_starts);
  p.row_to_batch_stride = stride_or_zero(row_to_batch);
  p.page_table_row_starts_stride = stride_or_zero(page_table_row_starts);
  p.rows = indices.size(0);
  p.k = indices.size(1);
  p.batches = page_table.size(0);
  p.max_pages = page_table.size(1);
  p.page_table_stride = page_table.stride(0);
  p.page_size = page_size;

  // The launcher queries the current device and torch's stream belongs to the tensors' device.
  torch::stable::accelerator::DeviceGuard guard(device);
  void* stream = current_stream(kOp, device);
  const cudaError_t err = dsa_cuda::launch_page_table_transform(p, static_cast<cudaStream_t>(stream));
  STD_TORCH_CHECK(err == cudaSuccess, kOp, ": kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace

// A fragment, not STABLE_TORCH_LIBRARY: every op's binding file adds its own schema to the one
// dsa_cuda namespace, and torch allows only one non-fragment definition block per namespace.
STABLE_TORCH_LIBRARY_FRAGMENT(dsa_cuda, m) {
  m.def(
      "page_table_transform_out(Tensor indices, Tensor page_table, Tensor? row_to_batch, "
      "Tensor? page_table_row_starts, int page_size, Tensor(a!) out) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(dsa_cuda, CUDA, m) {
  m.impl("page_table_transform_out", TORCH_BOX(&page_table_transform_out));
}
