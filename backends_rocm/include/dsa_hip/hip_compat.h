// The HIP runtime names our .hip kernels use, on either vendor.
//
// AMD (hipcc / clang -x hip): the real HIP runtime, wave64 (gfx950).
// NVIDIA (nvcc, or host code of the compat build defining DSA_HIP_ON_CUDA): each name maps to its
// CUDA twin, warp size 32. That build runs the same kernel source on the H200 as a correctness
// check of the algorithm; it is not the CUDA backend.
//
// Kernels take the warp size as a template parameter and are instantiated with DSA_WARP_SIZE, so
// nothing assumes 32 or 64.
#pragma once

#include <cstdint>

#if defined(DSA_HIP_ON_CUDA) || (defined(__CUDACC__) && !defined(__HIP_PLATFORM_AMD__))

#ifndef DSA_HIP_ON_CUDA
#define DSA_HIP_ON_CUDA 1
#endif
#include <cuda_runtime.h>

#define DSA_WARP_SIZE 32

using hipStream_t = cudaStream_t;
using hipError_t = cudaError_t;
#define hipSuccess cudaSuccess
#define hipGetLastError cudaGetLastError
#define hipGetErrorString cudaGetErrorString
// HIP's launch macro; `kernel` may be a function pointer.
#define hipLaunchKernelGGL(kernel, grid, block, smem_bytes, stream, ...) \
  (kernel)<<<(grid), (block), (smem_bytes), (stream)>>>(__VA_ARGS__)

#else

#include <hip/hip_runtime.h>

#define DSA_WARP_SIZE 64

#endif

namespace dsa_hip {

#if defined(__CUDACC__) || defined(__HIP__)
// Block and thread index along x. On AMD through the compiler builtins: HIP's blockIdx/threadIdx go
// through device-library calls (__ockl_*) that stay unresolved, with a call stack and scratch, when
// the gfx950 ISA is built with -nogpulib as the compile gates do. Kernels take their grid stride
// from the host instead of reading gridDim.
__device__ __forceinline__ uint32_t block_id_x() {
#if defined(DSA_HIP_ON_CUDA)
  return blockIdx.x;
#else
  return __builtin_amdgcn_workgroup_id_x();
#endif
}

__device__ __forceinline__ uint32_t thread_id_x() {
#if defined(DSA_HIP_ON_CUDA)
  return threadIdx.x;
#else
  return __builtin_amdgcn_workitem_id_x();
#endif
}
// The bits of a float and back.
__device__ __forceinline__ uint32_t float_bits(float x) {
#if defined(DSA_HIP_ON_CUDA)
  return __float_as_uint(x);
#else
  return __builtin_bit_cast(uint32_t, x);
#endif
}

// Workgroup barrier with workgroup-scope release/acquire of LDS and global memory (HIP's
// __syncthreads, without the device-library call).
__device__ __forceinline__ void block_sync() {
#if defined(DSA_HIP_ON_CUDA)
  __syncthreads();
#else
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
#endif
}

// Relaxed atomic add on a word of LDS (shared memory); returns the old value.
__device__ __forceinline__ uint32_t lds_atomic_add(uint32_t* p, uint32_t v) {
#if defined(DSA_HIP_ON_CUDA)
  return atomicAdd(p, v);
#else
  return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_WORKGROUP);
#endif
}

// The value of lane `lane - d` of the wave (lane < d: its own value); every lane of the wave must
// call it. `lane` is the caller's lane (thread_id_x() % wave size).
__device__ __forceinline__ uint32_t wave_shfl_up(uint32_t v, uint32_t d, uint32_t lane) {
#if defined(DSA_HIP_ON_CUDA)
  (void)lane;
  return __shfl_up_sync(0xFFFFFFFFu, v, d);
#else
  const uint32_t src = lane >= d ? lane - d : lane;
  return uint32_t(__builtin_amdgcn_ds_bpermute(int(src << 2), int(v)));
#endif
}

// The value of lane `src` of the wave; `src` must be the same on every lane (wave-uniform), and
// every lane of the wave must call it. On AMD the result is a scalar (v_readlane).
__device__ __forceinline__ uint32_t wave_read_lane(uint32_t v, uint32_t src) {
#if defined(DSA_HIP_ON_CUDA)
  return __shfl_sync(0xFFFFFFFFu, v, int(src));
#else
  return uint32_t(__builtin_amdgcn_readlane(int(v), int(__builtin_amdgcn_readfirstlane(int(src)))));
#endif
}

// The kernel's first argument `arg0` (passed by value), read again from the kernel-argument
// segment where the returned reference is used. A grid-stride loop that calls it once per
// iteration makes each field a load where it is needed (scalar loads, from the scalar cache) rather
// than a value the compiler loads on entry and keeps in SGPRs across the whole kernel: a big
// argument struct would not fit beside the loop's own scalars. `arg0` must be the first parameter
// of the kernel: explicit kernel arguments start at offset 0 of the segment (AMDGPU code object
// ABI). Its address is never taken (that would copy it to scratch). On NVIDIA: `arg0` itself.
template <class T>
__device__ __forceinline__ const T& reread_arg0(const T& arg0) {
#if defined(DSA_HIP_ON_CUDA)
  return arg0;
#else
  (void)arg0;
  using ConstT = const __attribute__((address_space(4))) T;
  ConstT* p = (ConstT*)__builtin_amdgcn_kernarg_segment_ptr();
  __asm__ volatile("" : "+s"(p));  // a new pointer per call: the loads cannot be hoisted or merged
  return *(const T*)p;
#endif
}
#endif  // device compilers

// 16-byte vector of four int32: one global_load_dwordx4 on AMD, one LDG.128 on NVIDIA, when the
// address is 16-byte aligned. Our own type, so the kernels need neither vendor's int4.
struct alignas(16) Int4 {
  int32_t x, y, z, w;
};

}  // namespace dsa_hip
