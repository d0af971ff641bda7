// Shared by the C++ CUDA-key kernels of the routed dsa ops (csrc/*_route.cpp): the call into the Python router
// for what a fast path does not serve, the router's error message, which the stable ABI's dispatcher call does not
// pass back (Python hands it over through dsa_cuda::topk_route_error, set as _route's error sink), the devices a
// fast path serves, and the metadata helpers of the fast checks.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

// A macro argument as a string literal (the route files name their router's namespace by macro).
#define DSA_ROUTE_STR_(x) #x
#define DSA_ROUTE_STR(x) DSA_ROUTE_STR_(x)

namespace dsa_route_common {

// The Python router's message for the last call it failed in this thread; one string for every route file
// (an inline function's static is one object across the library's translation units).
inline std::string& router_error() {
  static thread_local std::string message;
  return message;
}

// Run the router `name` ("<namespace>::<op>") on these arguments and return the stack (results first).
template <typename... Args>
std::array<StableIValue, sizeof...(Args)> call_router(const std::string& name, const char* overload,
                                                      const Args&... args) {
  std::array<StableIValue, sizeof...(Args)> stack{torch::stable::detail::from(args)...};
  router_error().clear();
  if (torch_call_dispatcher(name.c_str(), overload, stack.data(), TORCH_ABI_VERSION) != TORCH_SUCCESS) {
    throw std::runtime_error(router_error().empty() ? name + " failed" : router_error());
  }
  return stack;
}

// The device of a routed op's fast path: `type` is the shim's code of the device type served (CUDA, or the CPU
// in a route's CPU test build, where any non-zero mask serves), `mask` bit d serves device d (set from Python after
// the library's load, cleared while another backend is forced; read on every call, written rarely).
struct ServedDevices {
  int32_t type;
  std::atomic<uint64_t> mask{0};

  bool serves(const torch::stable::Tensor& q) const;
};

inline int32_t device_type(const torch::stable::Tensor& t) {
  int32_t type = -1;
  aoti_torch_get_device_type(t.get(), &type);
  return type;
}

inline bool ServedDevices::serves(const torch::stable::Tensor& q) const {
  if (device_type(q) != type) {
    return false;
  }
  const uint64_t m = mask.load(std::memory_order_relaxed);
  if (type == aoti_torch_device_type_cpu()) {
    return m != 0;
  }
  const int32_t dev = q.get_device_index();
  return dev >= 0 && dev < 64 && ((m >> dev) & 1);
}

// t on q's device (type and index).
inline bool same_device(const torch::stable::Tensor& t, const torch::stable::Tensor& q) {
  return device_type(t) == device_type(q) && t.get_device_index() == q.get_device_index();
}

inline bool aligned16(const torch::stable::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// A new contiguous tensor of at most 4 dimensions (aoti_torch_empty_strided reaches at::empty_strided directly;
// new_empty and stable::empty go through the boxed dispatcher by name).
inline torch::stable::Tensor empty_contiguous(std::initializer_list<int64_t> sizes, int32_t dtype, int32_t type,
                                              int32_t device) {
  int64_t size[4];
  int64_t stride[4];
  const int64_t dim = static_cast<int64_t>(sizes.size());
  int64_t i = 0;
  for (int64_t s : sizes) {
    size[i++] = s;
  }
  int64_t step = 1;
  for (int64_t j = dim - 1; j >= 0; --j) {
    stride[j] = step;
    step *= size[j] > 0 ? size[j] : 1;
  }
  AtenTensorHandle h = nullptr;
  if (aoti_torch_empty_strided(dim, size, stride, dtype, type, device, &h) != AOTI_TORCH_SUCCESS) {
    throw std::runtime_error("dsa: allocating an output failed");
  }
  return torch::stable::Tensor(h);
}

}  // namespace dsa_route_common
