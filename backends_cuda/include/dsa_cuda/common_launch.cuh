// Launch plumbing shared by every dsa_ops CUDA kernel. Torch-free: kernels/*.cu build with plain nvcc.
#pragma once

#include <cuda.h>  // (types of the driver's launch only: the driver is reached through cudart)
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

// Return the error of a failing CUDA runtime call to the caller (launchers return cudaError_t;
// the torch binding turns a non-success into an exception).
#define DSA_CUDA_CHECK(expr)              \
  do {                                    \
    const cudaError_t dsa_err_ = (expr);  \
    if (dsa_err_ != cudaSuccess) {        \
      return dsa_err_;                    \
    }                                     \
  } while (0)

namespace dsa_cuda {

// Programmatic dependent launch (SM90+). A kernel launched with programmatic stream serialization
// may start while the previous kernel in the stream is still running: it must wait before its
// first read of anything that kernel wrote. Both are no-ops below SM90 and without the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Let the next kernel in the stream start its prologue now. Safe anywhere: its pdl_wait() still
// waits for this whole grid to finish and flush its memory.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Per-device values are cached for up to this many devices (launchers ask on every call).
constexpr int kMaxDevices = 64;

// `device`'s entry of `cache` (a static array of kMaxDevices; T{} means not yet known), filled by
// `make(device, &value)` on first use; devices past kMaxDevices call `make` every time.
template <typename T, typename Make>
cudaError_t per_device(std::atomic<T> (&cache)[kMaxDevices], int device, T* value, Make&& make) {
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached) {
    *value = cache[device].load(std::memory_order_acquire);
    if (*value != T{}) {
      return cudaSuccess;
    }
  }
  DSA_CUDA_CHECK(make(device, value));
  if (cached) {
    cache[device].store(*value, std::memory_order_release);
  }
  return cudaSuccess;
}

// A device attribute, cached per device.
template <cudaDeviceAttr kAttr>
cudaError_t device_attr(int device, int* value) {
  static std::atomic<int> cache[kMaxDevices] = {};
  return per_device(cache, device, value, [](int d, int* v) { return cudaDeviceGetAttribute(v, kAttr, d); });
}

// Compute capability major of the current device.
inline cudaError_t current_arch_major(int* major) {
  int device = 0;
  DSA_CUDA_CHECK(cudaGetDevice(&device));
  return device_attr<cudaDevAttrComputeCapabilityMajor>(device, major);
}

// SM count of the current device.
inline cudaError_t current_sm_count(int* sms) {
  int device = 0;
  DSA_CUDA_CHECK(cudaGetDevice(&device));
  return device_attr<cudaDevAttrMultiProcessorCount>(device, sms);
}

// Whether a pointer allows 16-byte vector accesses.
inline bool is_aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

namespace launch_detail {

// cudaLaunchKernelEx finds the kernel's function from its host stub on every launch. The driver's
// cuLaunchKernelEx, given the function looked up once per kernel and device, takes ~0.3 us less host
// time a launch on the H200 host (tools/smxx_launch_host_cost.cu). Both are reached through
// cudart, so the library does not link the driver.
using DriverLaunch = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);

// cuLaunchKernelEx, or nullptr where the driver does not give it (then the runtime launches).
inline DriverLaunch driver_launch() {
  static const DriverLaunch fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuLaunchKernelEx", &p, 12000, cudaEnableDefault, &found);
    return err == cudaSuccess && found == cudaDriverEntryPointSuccess ? reinterpret_cast<DriverLaunch>(p) : nullptr;
  }();
  return fn;
}

// The function of `kernel` in the current device's context, `device`: found once, then read without a
// lock. nullptr when the lookup fails or the table is full (then the runtime launches).
inline CUfunction function_of(const void* kernel, int device) {
  struct Slot {
    std::atomic<const void*> kernel{nullptr};  // set last: a reader that sees it sees the rest
    int device = -1;
    CUfunction fn = nullptr;
  };
  constexpr int kSlots = 64;  // (kernels launched x devices; this library launches 15 kernels)
  static Slot slots[kSlots];
  static std::mutex fill;
  for (Slot& s : slots) {  // slots fill in order: the first empty one ends the search
    const void* k = s.kernel.load(std::memory_order_acquire);
    if (k == nullptr) {
      break;
    }
    if (k == kernel && s.device == device) {
      return s.fn;
    }
  }
  std::lock_guard<std::mutex> lock(fill);
  for (Slot& s : slots) {
    const void* k = s.kernel.load(std::memory_order_relaxed);
    if (k == kernel && s.device == device) {
      return s.fn;
    }
    if (k == nullptr) {
      cudaFunction_t fn = nullptr;
      if (cudaGetFuncBySymbol(&fn, kernel) != cudaSuccess) {
        cudaGetLastError();  // (not sticky: the runtime launch reports what is wrong)
        return nullptr;
      }
      s.device = device;
      s.fn = reinterpret_cast<CUfunction>(fn);
      s.kernel.store(kernel, std::memory_order_release);
      return s.fn;
    }
  }
  return nullptr;
}

// An attribute's value: the runtime's and the driver's attributes name it differently, its members alike.
inline cudaLaunchAttributeValue& value_of(cudaLaunchAttribute& a) { return a.val; }
inline CUlaunchAttributeValue& value_of(CUlaunchAttribute& a) { return a.value; }

// The launch attributes into `attrs` (the runtime's or the driver's): programmatic stream serialization
// when `pdl`, a cluster of `cluster` CTAs along x when cluster > 1. Returns how many.
template <typename Attr, typename Id>
unsigned fill_attributes(Attr (&attrs)[2], bool pdl, int cluster, Id pdl_id, Id cluster_id) {
  unsigned n = 0;
  if (pdl) {
    attrs[n].id = pdl_id;
    value_of(attrs[n]).programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster > 1) {
    attrs[n].id = cluster_id;
    value_of(attrs[n]).clusterDim.x = unsigned(cluster);
    value_of(attrs[n]).clusterDim.y = 1;
    value_of(attrs[n]).clusterDim.z = 1;
    ++n;
  }
  return n;
}

// Launch through the driver: true when the kernel was enqueued. `params` holds the kernel's parameters.
template <typename Tuple, std::size_t... I>
bool try_driver_launch(const void* kernel, int device, dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                       bool pdl, int cluster, Tuple& params, std::index_sequence<I...>) {
  const DriverLaunch launch = driver_launch();
  const CUfunction fn = launch != nullptr ? function_of(kernel, device) : nullptr;
  if (fn == nullptr) {
    return false;
  }
  CUlaunchConfig config = {};
  config.gridDimX = grid.x;
  config.gridDimY = grid.y;
  config.gridDimZ = grid.z;
  config.blockDimX = block.x;
  config.blockDimY = block.y;
  config.blockDimZ = block.z;
  config.sharedMemBytes = unsigned(smem_bytes);
  config.hStream = reinterpret_cast<CUstream>(stream);
  CUlaunchAttribute attrs[2];
  const unsigned n_attrs = fill_attributes(attrs, pdl, cluster, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                                           CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
  config.attrs = n_attrs > 0 ? attrs : nullptr;
  config.numAttrs = n_attrs;
  void* args[] = {static_cast<void*>(&std::get<I>(params))..., nullptr};
  return launch(&config, fn, args, nullptr) == CUDA_SUCCESS;
}

}  // namespace launch_detail

// Launch `kernel` on `stream`, with programmatic stream serialization on SM90+ so it overlaps the
// tail of the kernel before it (the kernel must call pdl_wait() before reading its inputs), in
// thread-block clusters of `cluster` CTAs along x when cluster > 1. Works under CUDA graph capture.
// Through the driver with the kernel's function cached (launch_detail); where that is not available or
// fails, through cudaLaunchKernelEx, whose error is the one returned.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_pdl_clustered(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem_bytes,
                                 cudaStream_t stream, int cluster, Args&&... args) {
  int device = 0;
  int major = 0;
  DSA_CUDA_CHECK(cudaGetDevice(&device));
  DSA_CUDA_CHECK(device_attr<cudaDevAttrComputeCapabilityMajor>(device, &major));
  std::tuple<std::decay_t<KernelArgs>...> params(std::forward<Args>(args)...);
  if (launch_detail::try_driver_launch(reinterpret_cast<const void*>(kernel), device, grid, block, smem_bytes, stream,
                                       major >= 9, cluster, params, std::index_sequence_for<KernelArgs...>{})) {
    return cudaSuccess;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attrs[2];
  const unsigned n_attrs = launch_detail::fill_attributes(attrs, major >= 9, cluster,
                                                          cudaLaunchAttributeProgrammaticStreamSerialization,
                                                          cudaLaunchAttributeClusterDimension);
  config.attrs = n_attrs > 0 ? attrs : nullptr;
  config.numAttrs = n_attrs;
  return std::apply([&](auto&... a) { return cudaLaunchKernelEx(&config, kernel, a...); }, params);
}

// launch_pdl for a kernel with `smem_bytes` of dynamic shared memory, which may exceed the 48 KB
// default: the kernel's limit is raised once per device (the attribute belongs to the function in
// the current device's context, not to the launch).
template <auto kKernel, typename... Args>
cudaError_t launch_pdl_smem(dim3 grid, dim3 block, int smem_bytes, cudaStream_t stream, Args&&... args);

// launch_pdl_clustered without clusters.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem_bytes,
                       cudaStream_t stream, Args&&... args) {
  return launch_pdl_clustered(kernel, grid, block, smem_bytes, stream, 1, std::forward<Args>(args)...);
}

template <auto kKernel, typename... Args>
cudaError_t launch_pdl_smem(dim3 grid, dim3 block, int smem_bytes, cudaStream_t stream, Args&&... args) {
  static std::atomic<bool> configured[kMaxDevices] = {};
  int device = 0;
  DSA_CUDA_CHECK(cudaGetDevice(&device));
  bool done = false;
  DSA_CUDA_CHECK(per_device(configured, device, &done, [&](int, bool* v) {
    *v = true;
    return cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  }));
  return launch_pdl(kKernel, grid, block, size_t(smem_bytes), stream, std::forward<Args>(args)...);
}

}  // namespace dsa_cuda
