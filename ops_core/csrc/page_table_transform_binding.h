// The torch binding body of dsa.page_table_transform, shared by the CUDA (backends_cuda/csrc) and the
// native HIP (backends_rocm/csrc) bindings: the argument checks, the params and the launch on torch's
// current stream. Each backend's binding names its params type and wraps its launcher.
#pragma once

#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>
#include <optional>

#include "dsa_binding.h"

namespace dsa_binding {

// The schema of <backend namespace>::page_table_transform_out.
constexpr const char* kPageTableTransformOutSchema =
    "page_table_transform_out(Tensor indices, Tensor page_table, Tensor? row_to_batch, "
    "Tensor? page_table_row_starts, int page_size, Tensor(a!) out) -> ()";

// Params: the backend's PageTableTransformParams (the same fields in dsa_cuda and dsa_hip).
// launch(params, stream) returns nullptr, or the message of the launch error.
template <class Params, class Launch>
void page_table_transform_out(const char* op, const Tensor& indices, const Tensor& page_table,
                              const std::optional<Tensor>& row_to_batch,
                              const std::optional<Tensor>& page_table_row_starts, int64_t page_size,
                              const Tensor& out, const Launch& launch) {
  STD_TORCH_CHECK(indices.dim() == 2 && is_int32(indices) && indices.is_cuda() && indices.is_contiguous(), op,
                  ": `indices` must be a contiguous int32 [rows, k] GPU tensor");
  const int32_t device = indices.get_device_index();
  STD_TORCH_CHECK(out.dim() == 2 && out.size(0) == indices.size(0) && out.size(1) == indices.size(1) &&
                      is_int32(out) && out.is_cuda() && out.get_device_index() == device && out.is_contiguous(),
                  op, ": `out` must be a contiguous int32 tensor shaped like `indices`, on its device");
  STD_TORCH_CHECK(page_table.dim() == 2 && is_int32(page_table) && page_table.is_cuda() &&
                      page_table.get_device_index() == device &&
                      (page_table.size(1) <= 1 || page_table.stride(1) == 1),
                  op, ": `page_table` must be an int32 [batches, max_pages] tensor with unit last stride");
  check_row_vector(op, row_to_batch, "row_to_batch", indices, "indices");
  check_row_vector(op, page_table_row_starts, "page_table_row_starts", indices, "indices");
  STD_TORCH_CHECK(page_size > 0 && (page_size & (page_size - 1)) == 0, op,
                  ": `page_size` must be a power of two, got ", page_size);

  Params p;
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
  dsa_binding::DeviceScope on_device(device);
  const char* error = launch(p, current_stream(op, device));
  STD_TORCH_CHECK(error == nullptr, op, ": kernel launch failed: ", error);
}

}  // namespace dsa_binding
