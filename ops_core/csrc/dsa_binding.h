// Helpers shared by every backend's stable-ABI torch bindings (backends_cuda/csrc, backends_rocm/csrc).
// The Python ops validate every argument; a binding's own checks only keep a direct call of its internal
// entry point from touching memory outside its tensors. Build with -DUSE_CUDA (the current-stream shim,
// which ROCm builds of torch export under the same name).
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>
#include <optional>

#ifndef USE_CUDA
#error "build with -DUSE_CUDA: the current-stream shim (aoti_torch_get_current_cuda_stream) needs it"
#endif

namespace dsa_binding {

using torch::stable::Tensor;

inline bool is_int32(const Tensor& t) { return t.scalar_type() == torch::headeronly::ScalarType::Int; }

inline bool unit_last_stride(const Tensor& t) { return t.size(t.dim() - 1) <= 1 || t.stride(t.dim() - 1) == 1; }

// An optional int32 [rows] tensor on the device of `like` (whose rows are size(0)).
inline void check_row_vector(const char* op, const std::optional<Tensor>& t, const char* name, const Tensor& like,
                             const char* like_name) {
  if (!t.has_value()) {
    return;
  }
  STD_TORCH_CHECK(t->dim() == 1 && t->size(0) == like.size(0) && is_int32(*t) && t->is_cuda() &&
                      t->get_device_index() == like.get_device_index(),
                  op, ": `", name, "` must be an int32 [rows] tensor on the device of `", like_name, "`");
}

inline const int32_t* ptr_or_null(const std::optional<Tensor>& t) {
  return t.has_value() ? static_cast<const int32_t*>(t->data_ptr()) : nullptr;
}

inline int64_t stride_or_zero(const std::optional<Tensor>& t) { return t.has_value() ? t->stride(0) : 0; }

// Makes `device` the current device for its scope, as torch::stable::accelerator::DeviceGuard does, but
// creates that guard only when another device is current: the guard is a heap object and two calls into
// torch even when it changes nothing (~0.5 us a call on the H200 host, tools/probe_host.py).
// (Unnamed namespace: the stable guard's type has hidden visibility, so must a class holding it.)
namespace {
class DeviceScope {
 public:
  explicit DeviceScope(int32_t device) {
    if (torch::stable::accelerator::getCurrentDeviceIndex() != device) {
      guard_.emplace(device);
    }
  }

 private:
  std::optional<torch::stable::accelerator::DeviceGuard> guard_;
};
}  // namespace

// torch's current stream on `device` (a cudaStream_t or hipStream_t). Call under a DeviceScope.
inline void* current_stream(const char* op, int32_t device) {
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(device, &stream) == AOTI_TORCH_SUCCESS, op,
                  ": could not get the current stream");
  return stream;
}

}  // namespace dsa_binding
