// Thread-block cluster primitives on 32-bit shared-memory addresses (sm_90 and newer): this CTA's rank, a
// peer's address of a shared variable, a 16-byte remote store that completes its bytes on the peer's mbarrier,
// a remote mbarrier arrival, the cluster barrier. Torch-free.
//
// Scope: every operation here is at CTA scope or relaxed. nvcc 13.0 lowers mbarrier.try_wait with
// .acquire.cluster to a CCTL.IVALL (the SM's whole L1 invalidated) after each wait, and an arrive with
// .release.cluster to MEMBAR.ALL.GPU (waits for every outstanding load of the thread): both cost a kernel
// that keeps its gathered rows in L1 and has loads in flight at each arrive. The data a peer writes with
// st_async128 is ordered by the complete-tx on the receiving CTA's own mbarrier, which its threads wait on at
// CTA scope (as CUTLASS's cluster barriers and FlashMLA's paired decode do).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsa_cuda {
namespace smxx {

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// The shared::cluster address of this CTA's shared address `local` in cluster CTA `rank`.
__device__ __forceinline__ uint32_t peer_smem(uint32_t local, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}

// 16 bytes to a peer's shared memory (`remote`, a shared::cluster address), their bytes completed on the
// peer's mbarrier at `remote_bar`.
__device__ __forceinline__ void st_async128(uint32_t remote, uint32_t a, uint32_t b, uint32_t c, uint32_t d,
                                            uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                   remote),
               "r"(a), "r"(b), "r"(c), "r"(d), "r"(remote_bar)
               : "memory");
}

// One arrival on a peer's mbarrier (release at CTA scope: see the header).
__device__ __forceinline__ void mbar_arrive_remote(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cluster.b64 _, [%0];" ::"r"(remote_bar) : "memory");
}

// Every thread of every CTA of the cluster. With release / acquire: the mbarrier initialisations before it are
// visible to the peers after it (once, at the start). Relaxed: no CTA leaves while a peer may still write
// to its shared memory or arrive on its barriers (at the end).
__device__ __forceinline__ void cluster_sync_acq_rel() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_sync_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
}

#endif

}  // namespace smxx
}  // namespace dsa_cuda
