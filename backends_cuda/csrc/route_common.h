// Shared by the C++ CUDA-key kernels of the routed dsa ops (csrc/*_route.cpp): the call into the Python router
// for what a fast path does not serve, and the router's error message, which the stable ABI's dispatcher call
// does not pass back (Python hands it over through dsa_cuda::topk_route_error, set as _route's error sink).
#pragma once

#include <torch/csrc/stable/library.h>

#include <array>
#include <stdexcept>
#include <string>

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

}  // namespace dsa_route_common
