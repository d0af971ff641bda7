// A CUDA device's attributes for the routed ops' C++ kernels (csrc/*_route.cpp), asked once per device and
// attribute: the split rules need the SM count on every call. CUDA builds only (the route files' CPU test builds
// stub what they use).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace dsa_route_common {

// Per attribute and device, 0 until asked; an inline variable: one object for every route file, statically
// zeroed (a function-local static would add an initialisation guard to every call).
template <cudaDeviceAttr kAttr>
inline std::atomic<int> g_device_attribute[64];

// Attribute kAttr of `device` (0 <= device < 64: ServedDevices::serves admits no other).
template <cudaDeviceAttr kAttr>
int device_attribute(int32_t device) {
  std::atomic<int>* cache = g_device_attribute<kAttr>;
  int v = cache[device].load(std::memory_order_relaxed);
  if (v == 0) {
    if (cudaDeviceGetAttribute(&v, kAttr, device) != cudaSuccess || v <= 0) {
      throw std::runtime_error("dsa: cudaDeviceGetAttribute(" + std::to_string(int(kAttr)) + ") failed on device " +
                               std::to_string(device));
    }
    cache[device].store(v, std::memory_order_relaxed);
  }
  return v;
}

inline int sm_count(int32_t device) { return device_attribute<cudaDevAttrMultiProcessorCount>(device); }
inline int cc_major(int32_t device) { return device_attribute<cudaDevAttrComputeCapabilityMajor>(device); }

}  // namespace dsa_route_common
