// tcgen05 wrappers shared by the Blackwell (sm_100a, sm_103a, sm_107a) kernels: shared memory and
// instruction descriptors, MMA issue and commit, tensor memory loads and stores, the tcgen05 fences.
// The review against the PTX ISA (section 9.7.16, "TensorCore 5th Generation Family Instructions") is in
// sm100_sparse_mla_decode.cuh (kind::f16) and sm100_indexer_logits.cuh (kind::f8f6f4). Torch-free.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

// tcgen05 device code: the arch-specific Blackwell datacenter targets whose PTX has tcgen05.
#if defined(__CUDA_ARCH__) && \
    (defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM103_ALL) || defined(__CUDA_ARCH_FEAT_SM107_ALL))
#define DSA_SM100_DEVICE 1
#else
#define DSA_SM100_DEVICE 0
#endif

namespace dsa_cuda {
namespace sm100 {

#if DSA_SM100_DEVICE

// sm_100 shared memory descriptor, SWIZZLE_128B (layout type 2 in bits 61-63, the fixed 0b001 in bits
// 46-48, base offset 0): start, LBO (bytes; K-major swizzled layouts ignore it), SBO 1024.
__device__ __forceinline__ uint64_t umma_desc(uint32_t addr, uint32_t lbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 46) | (uint64_t(2) << 61);
}

__device__ __forceinline__ void tc_fence_before() { asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory"); }
__device__ __forceinline__ void tc_fence_after() { asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory"); }

// D[tmem] (+)= A * B, cta_group::1, kind::f16; accumulate iff `acc`.
__device__ __forceinline__ void umma(uint32_t d, uint64_t a_desc, uint64_t b_desc, uint32_t idesc, uint32_t acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %4, 0;\n"
      "tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, p;\n}\n" ::"r"(d),
      "l"(a_desc), "l"(b_desc), "r"(idesc), "r"(acc)
      : "memory");
}

// D[tmem] (+)= A * B, cta_group::1, kind::f8f6f4 (e4m3 operands); accumulate iff `acc`.
__device__ __forceinline__ void umma_f8(uint32_t d, uint64_t a_desc, uint64_t b_desc, uint32_t idesc, uint32_t acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %4, 0;\n"
      "tcgen05.mma.cta_group::1.kind::f8f6f4 [%0], %1, %2, %3, p;\n}\n" ::"r"(d),
      "l"(a_desc), "l"(b_desc), "r"(idesc), "r"(acc)
      : "memory");
}

// One arrival on `bar` once every earlier MMA of this thread has completed.
__device__ __forceinline__ void umma_commit(uint32_t bar) {
  asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];" ::"r"(bar) : "memory");
}

#define DSA_R8(b) "=r"(v[b]), "=r"(v[b + 1]), "=r"(v[b + 2]), "=r"(v[b + 3]), "=r"(v[b + 4]), "=r"(v[b + 5]), \
                  "=r"(v[b + 6]), "=r"(v[b + 7])
#define DSA_W8(b) "r"(v[b]), "r"(v[b + 1]), "r"(v[b + 2]), "r"(v[b + 3]), "r"(v[b + 4]), "r"(v[b + 5]), \
                  "r"(v[b + 6]), "r"(v[b + 7])
#define DSA_REGS32                                                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"

// 32 consecutive columns of this thread's lane (32x32b.x32); the caller waits (tmem_wait_ld).
__device__ __forceinline__ void tmem_ld32(uint32_t taddr, uint32_t (&v)[32]) {
  asm volatile("tcgen05.ld.sync.aligned.32x32b.x32.b32 " DSA_REGS32 ", [%32];"
               : DSA_R8(0), DSA_R8(8), DSA_R8(16), DSA_R8(24)
               : "r"(taddr)
               : "memory");
}

__device__ __forceinline__ void tmem_st32(uint32_t taddr, const uint32_t (&v)[32]) {
  asm volatile("tcgen05.st.sync.aligned.32x32b.x32.b32 [%0], {%1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
               "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
               "%31, %32};" ::"r"(taddr),
               DSA_W8(0), DSA_W8(8), DSA_W8(16), DSA_W8(24)
               : "memory");
}

#undef DSA_REGS32
#undef DSA_W8
#undef DSA_R8

__device__ __forceinline__ void tmem_wait_ld() { asm volatile("tcgen05.wait::ld.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void tmem_wait_st() { asm volatile("tcgen05.wait::st.sync.aligned;" ::: "memory"); }

#endif  // DSA_SM100_DEVICE

}  // namespace sm100
}  // namespace dsa_cuda
