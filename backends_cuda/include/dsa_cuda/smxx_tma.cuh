// TMA tile loads (cp.async.bulk.tensor, sm_90 and newer) into shared memory, completing on an mbarrier,
// for the SM90 and SM100 kernels. The tensor maps are encoded on the host (the launchers). Torch-free.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include <cstdint>

namespace dsa_cuda {
namespace smxx {

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)

// The box of `map` at element coordinates (x, y) into shared memory at dst; its bytes complete on bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int32_t x, int32_t y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// The 1-D box of `map` at element x into shared memory at dst; its bytes complete on bar.
__device__ __forceinline__ void tma_load_1d(uint32_t dst, const CUtensorMap* map, int32_t x, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2}], [%3];"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// The 3-D box of `map` at element coordinates (x, y, z) into shared memory at dst; its bytes complete on bar.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int32_t x, int32_t y, int32_t z,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];" ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(bar)
      : "memory");
}

#endif

}  // namespace smxx
}  // namespace dsa_cuda
