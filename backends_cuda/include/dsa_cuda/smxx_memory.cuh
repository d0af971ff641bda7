// Shared-memory addresses, loads and stores, cp.async, in-order global loads and the exact e4m3 -> f16 widening
// (sm_90 and newer): the PTX wrappers every SM90 / SM100 kernel family uses (the indexer kernels through
// smxx_indexer.cuh and sm90_indexer_core.cuh, the sparse MLA decode kernels through smxx_sparse_mla_decode.cuh,
// sparse attention through smxx_sparse_attention.cuh). Torch-free.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsa_cuda {
namespace smxx {

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The dynamic shared memory from its first 1024-aligned byte (kSmemBytes holds 1024 bytes of slack): addr, its
// shared-window address, and ptr, the matching generic pointer. Set by a constructor: a function returning the
// struct made nvcc 13.0 stop folding ptr's shared address to addr (the sm_90a MLA decode SASS changed).
// 1 KiB: 128-byte swizzle atoms (8 rows x 128 B) and the TMA / MMA descriptors over them need 1024-aligned bases.
struct AlignedDynSmem {
  uint32_t addr;
  uint8_t* ptr;
  __device__ __forceinline__ AlignedDynSmem() {
    extern __shared__ uint8_t smxx_dyn_smem[];
    const uint32_t raw = smem_addr(smxx_dyn_smem);
    addr = (raw + 1023u) & ~1023u;
    ptr = smxx_dyn_smem + (addr - raw);
  }
};

// A load the compiler keeps in program order with the barrier waits (asm volatile), so it is in flight
// while the thread waits.
__device__ __forceinline__ float ldg_early(const float* p) {
  float v;
  asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ int32_t ldg_early(const int32_t* p) {
  int32_t v;
  asm volatile("ld.global.nc.s32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// *ptr when p, else zero (ptr not read); in program order as ldg_early.
__device__ __forceinline__ float ldg_if(bool p, const float* ptr) {
  float v;
  asm volatile(
      "{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\nmov.f32 %0, 0f00000000;\n@q ld.global.nc.f32 %0, [%1];\n}\n"
      : "=f"(v)
      : "l"(ptr), "r"(int(p)));
  return v;
}

// *ptr when p, else `otherwise` (ptr not read); in program order as ldg_early.
__device__ __forceinline__ int32_t ldg_if(bool p, const int32_t* ptr, int32_t otherwise) {
  int32_t v;
  asm volatile(
      "{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\nmov.b32 %0, %3;\n@q ld.global.nc.s32 %0, [%1];\n}\n"
      : "=r"(v)
      : "l"(ptr), "r"(int(p)), "r"(otherwise));
  return v;
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// Arrive on `bar` once this thread's earlier cp.async have landed (counts against the expected count).
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ void sts32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ void sts128(uint32_t addr, const uint4& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// Two e4m3 (low byte first) -> f16x2, exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t x) {
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(static_cast<uint16_t>(x)));
  return r;
}

// Four e4m3 (low byte first) as two f16x2, exact: lo from bytes 0-1, hi from bytes 2-3. The 16-bit split is
// inside the asm (two e4m3x2_to_f16x2 on w & 0xFFFF and w >> 16 gave the sparse attention cubin 72 more instructions, nvcc 13.0).
__device__ __forceinline__ void e4m3x4_to_f16x4(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 a, b;\nmov.b32 {a, b}, %2;\ncvt.rn.f16x2.e4m3x2 %0, a;\ncvt.rn.f16x2.e4m3x2 %1, b;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}

#endif

}  // namespace smxx
}  // namespace dsa_cuda
