// The binding entry of the top-k family (csrc/topk.cpp), shared with the C++ route of the dsa ops
// (csrc/topk_route.cpp) so that the checks and the params filling exist once.
//
// Host cost: every Tensor::size / stride / scalar_type / get_device_index / data_ptr is a call into
// torch's C shim, so each tensor's metadata is read once (TensorInfo) and handed on: the route's fast
// check and topk_out's checks read it, and topk_launch (no checks) fills the params from it.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <optional>

namespace dsa_cuda_binding {

using torch::stable::Tensor;

// One tensor's metadata, read through the C shim once. `sizes` and `strides` are borrowed from the
// tensor (valid while it lives, which the caller's Tensor guarantees); the data pointer is read by
// topk_launch only (a tensor the route allocates needs nothing else read).
struct TensorInfo {
  AtenTensorHandle handle;
  int64_t dim;
  const int64_t* sizes;
  const int64_t* strides;
  int32_t dtype;  // aoti_torch_dtype_*
  int32_t device_type;
  int32_t device_index;

  int64_t size(int64_t d) const { return sizes[d]; }
  int64_t stride(int64_t d) const { return strides[d]; }
  // size(last) <= 1 or stride(last) == 1 (dim >= 1).
  bool unit_last_stride() const { return sizes[dim - 1] <= 1 || strides[dim - 1] == 1; }
  bool same_device(const TensorInfo& o) const {
    return device_type == o.device_type && device_index == o.device_index;
  }
};

inline TensorInfo info_of(const Tensor& t) {
  TensorInfo i{};
  i.handle = t.get();
  aoti_torch_get_dim(i.handle, &i.dim);
  int64_t* sizes = nullptr;
  int64_t* strides = nullptr;
  aoti_torch_get_sizes(i.handle, &sizes);
  aoti_torch_get_strides(i.handle, &strides);
  i.sizes = sizes;
  i.strides = strides;
  aoti_torch_get_dtype(i.handle, &i.dtype);
  aoti_torch_get_device_type(i.handle, &i.device_type);
  aoti_torch_get_device_index(i.handle, &i.device_index);
  return i;
}

// An optional tensor's metadata (nullopt when absent), and the pointer TopkCall takes for it.
inline std::optional<TensorInfo> info_of(const std::optional<Tensor>& t) {
  return t.has_value() ? std::optional<TensorInfo>(info_of(*t)) : std::nullopt;
}

inline const TensorInfo* ptr(const std::optional<TensorInfo>& i) { return i.has_value() ? &*i : nullptr; }

// The shim's dtype codes, asked once at load (one copy for the binding and the route).
inline const int32_t kFloat32 = aoti_torch_dtype_float32();
inline const int32_t kBFloat16 = aoti_torch_dtype_bfloat16();
inline const int32_t kFloat16 = aoti_torch_dtype_float16();
inline const int32_t kInt32 = aoti_torch_dtype_int32();

// The conditions topk_out checks and the route's fast check proves, on metadata read once.
// The score dtypes the kernels take.
inline bool score_dtype_ok(int32_t dtype) { return dtype == kFloat32 || dtype == kBFloat16 || dtype == kFloat16; }

// An int32 [rows] tensor on the device of `scores` (Python's int32_rows_ok).
inline bool rows_ok(const TensorInfo& t, const TensorInfo& scores) {
  return t.dim == 1 && t.dtype == kInt32 && t.size(0) == scores.size(0) && t.same_device(scores);
}

// An int32 [batches, max_pages] page table with unit last stride on the device of `scores`.
inline bool page_table_ok(const TensorInfo& page_table, const TensorInfo& scores) {
  return page_table.dim == 2 && page_table.dtype == kInt32 && page_table.unit_last_stride() &&
         page_table.same_device(scores);
}

// An int32 [rows, k] buffer with unit last stride on the device of `scores`, whose rows do not overlap (Python's
// out_ok and check_out_alone's self-overlap test).
inline bool out_ok(const TensorInfo& out, const TensorInfo& scores, int64_t k) {
  return out.dim == 2 && out.dtype == kInt32 && out.size(0) == scores.size(0) && out.size(1) == k &&
         out.unit_last_stride() && out.same_device(scores) && (out.size(0) <= 1 || out.stride(0) >= k);
}

// Two int32 [rows, k] buffers that out_ok accepted share no byte (else the router refuses the call by name).
inline bool disjoint_outs(const TensorInfo& a, const TensorInfo& b) {
  void* pa = nullptr;
  void* pb = nullptr;
  aoti_torch_get_data_ptr(a.handle, &pa);
  aoti_torch_get_data_ptr(b.handle, &pb);
  const auto span = [](const TensorInfo& t) {  // bytes from the first element to one past the last
    return t.size(0) == 0 || t.size(1) == 0 ? int64_t{0} : ((t.size(0) - 1) * t.stride(0) + t.size(1)) * 4;
  };
  const auto lo_a = reinterpret_cast<uintptr_t>(pa), lo_b = reinterpret_cast<uintptr_t>(pb);
  const int64_t sa = span(a), sb = span(b);
  return sa == 0 || sb == 0 || lo_a + uintptr_t(sa) <= lo_b || lo_b + uintptr_t(sb) <= lo_a;
}

// The arguments of one launch; an absent optional tensor is nullptr. `out` may be a tensor this
// call allocated as contiguous int32 [rows, k] on the device of `scores`.
struct TopkCall {
  const TensorInfo* scores;
  int64_t k;
  const TensorInfo* lengths;
  const TensorInfo* row_starts;
  bool deterministic;
  const TensorInfo* page_table;  // the page-table form
  const TensorInfo* page_table_row_starts;
  const TensorInfo* row_to_batch;
  int64_t page_size;
  const TensorInfo* offsets;  // the ragged form
  const TensorInfo* out;
  const TensorInfo* out_raw;
  bool nan_first;  // NaN ranks above every number (last in the aggregate: false when left out)
};

// torch.ops.dsa_cuda.topk_out: checks what keeps the launch in bounds, then launches on torch's
// current stream. `page_table` selects the page-table form, `offsets` the ragged form.
void topk_out(Tensor scores, int64_t k, std::optional<Tensor> lengths, std::optional<Tensor> row_starts,
              bool deterministic, std::optional<Tensor> page_table, std::optional<Tensor> page_table_row_starts,
              std::optional<Tensor> row_to_batch, int64_t page_size, std::optional<Tensor> offsets, Tensor out,
              std::optional<Tensor> out_raw, bool nan_first);

// topk_out after its checks: fills the launch params and launches on torch's current stream of the
// device of `scores`. No checks: the caller has proved everything topk_out checks (topk_out itself,
// or the route's fast check).
void topk_launch(const TopkCall& call);

}  // namespace dsa_cuda_binding
