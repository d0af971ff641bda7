// Block-wide building blocks of the exact radix select used by the top-k kernels. Torch-free.
//
// Keys: every score becomes a uint32 whose unsigned order is the ranking order (DESIGN.md):
// larger score -> larger key, -0.0 and +0.0 -> the same key, every NaN -> `nan_key`: 0, below -inf's
// key (0x007FFFFF), or with nan_first 0xFFFFFFFF, above +inf's (0xFF800000). Ties are then broken by
// the smaller index, which the callers do by index order. nan_key is a runtime value (the kernel
// arguments' `nan_key`): one select where the key is made, no second instantiation of the kernels.
//
// The select runs up to three levels on the key bits 31..21, 20..10 and 9..0: each level
// histograms (2048 shared-memory bins) the keys whose already-fixed high bits equal the prefix
// found so far, and a block scan over the bins finds the bin that holds the k-th largest key.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dsa_cuda {
namespace radix {

constexpr int kBins = 2048;  // 11 bits per level; the last level (10 bits) uses half of them
constexpr int kLevels = 3;

// Bits of the key fixed after level l, and the shift of level l's digit ((key >> shift) & 0x7FF:
// the last level's digit also holds bit 10, which the prefix has already fixed, so the scan
// still finds the right bin).
__device__ __forceinline__ int level_shift(int level) { return level == 0 ? 21 : (level == 1 ? 10 : 0); }
__device__ __forceinline__ uint32_t level_mask(int level) {
  return level == 0 ? 0xFFE00000u : (level == 1 ? 0xFFFFFC00u : 0xFFFFFFFFu);
}

__device__ __forceinline__ uint32_t float_key(float x, uint32_t nan_key) {
  if (x != x) {
    return nan_key;  // every NaN: 0 (below -inf) or 0xFFFFFFFF (above +inf)
  }
  uint32_t b = __float_as_uint(x);
  if (x == 0.0f) {
    b = 0u;  // -0.0 -> +0.0
  }
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Raw 16-byte vectors of T -> keys. kItems = 16 / sizeof(T). raw(p): the bits of the score at p (16-bit
// types: zero-extended), loaded through the read-only path; of_raw(bits, nan_key): their key; one(p,
// nan_key): the key of the score at p (of_raw(raw(p), nan_key)).
template <typename T>
struct KeyOf;

template <>
struct KeyOf<float> {
  static constexpr int kItems = 4;
  __device__ __forceinline__ static uint32_t raw(const float* p) { return __ldg(reinterpret_cast<const uint32_t*>(p)); }
  __device__ __forceinline__ static uint32_t of_raw(uint32_t bits, uint32_t nan_key) {
    return float_key(__uint_as_float(bits), nan_key);
  }
  __device__ __forceinline__ static uint32_t one(const float* p, uint32_t nan_key) {
    return float_key(__ldg(p), nan_key);
  }
  __device__ __forceinline__ static void vec(const uint4& v, uint32_t (&k)[4], uint32_t nan_key) {
    k[0] = float_key(__uint_as_float(v.x), nan_key);
    k[1] = float_key(__uint_as_float(v.y), nan_key);
    k[2] = float_key(__uint_as_float(v.z), nan_key);
    k[3] = float_key(__uint_as_float(v.w), nan_key);
  }
};

__device__ __forceinline__ float bf16_bits_to_float(uint32_t bits16) { return __uint_as_float(bits16 << 16); }
__device__ __forceinline__ float fp16_bits_to_float(uint32_t bits16) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16)));
}

template <>
struct KeyOf<__nv_bfloat16> {
  static constexpr int kItems = 8;
  __device__ __forceinline__ static uint32_t raw(const __nv_bfloat16* p) {
    return __ldg(reinterpret_cast<const unsigned short*>(p));
  }
  __device__ __forceinline__ static uint32_t of_raw(uint32_t bits, uint32_t nan_key) {
    return float_key(bf16_bits_to_float(bits), nan_key);
  }
  __device__ __forceinline__ static uint32_t one(const __nv_bfloat16* p, uint32_t nan_key) {
    return of_raw(raw(p), nan_key);
  }
  __device__ __forceinline__ static void vec(const uint4& v, uint32_t (&k)[8], uint32_t nan_key) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      k[2 * j] = float_key(bf16_bits_to_float(w[j] & 0xFFFFu), nan_key);
      k[2 * j + 1] = float_key(bf16_bits_to_float(w[j] >> 16), nan_key);
    }
  }
};

template <>
struct KeyOf<__half> {
  static constexpr int kItems = 8;
  __device__ __forceinline__ static uint32_t raw(const __half* p) { return __ldg(reinterpret_cast<const unsigned short*>(p)); }
  __device__ __forceinline__ static uint32_t of_raw(uint32_t bits, uint32_t nan_key) {
    return float_key(fp16_bits_to_float(bits), nan_key);
  }
  __device__ __forceinline__ static uint32_t one(const __half* p, uint32_t nan_key) { return of_raw(raw(p), nan_key); }
  __device__ __forceinline__ static void vec(const uint4& v, uint32_t (&k)[8], uint32_t nan_key) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      k[2 * j] = float_key(fp16_bits_to_float(w[j] & 0xFFFFu), nan_key);
      k[2 * j + 1] = float_key(fp16_bits_to_float(w[j] >> 16), nan_key);
    }
  }
};

// Inclusive prefix sum over the block in thread order; `total` gets the block's sum. blockDim.x
// is a multiple of 32, at most 1024. `buf` is 32 words of shared memory. Two barriers inside;
// callers alternate between two buffers (or put a barrier between calls) so a fast warp of the
// next call never overwrites a buffer a slow warp still reads.
__device__ __forceinline__ uint32_t block_inclusive_scan(uint32_t v, uint32_t* buf, uint32_t& total) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t t = __shfl_up_sync(0xFFFFFFFFu, v, o);
    if (lane >= o) {
      v += t;
    }
  }
  if (lane == 31) {
    buf[warp] = v;
  }
  __syncthreads();
  if (warp == 0) {
    uint32_t w = lane < warps ? buf[lane] : 0u;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t t = __shfl_up_sync(0xFFFFFFFFu, w, o);
      if (lane >= o) {
        w += t;
      }
    }
    buf[lane] = w;
  }
  __syncthreads();
  total = buf[warps - 1];
  return v + (warp > 0 ? buf[warp - 1] : 0u);
}

// Shared state of one select, in static shared memory.
struct SelectShared {
  uint32_t scan[2][32];
  uint32_t bin;    // the bin holding the k-th largest of the candidates
  uint32_t above;  // candidates in higher bins
  uint32_t count;  // candidates in that bin
  uint32_t part_gt;  // split rows: this CTA's keys above the prefix, then equal to it
  uint32_t part_eq;
};

// Thread-block clusters (SM90+): a row split over the CTAs of one cluster merges its histograms
// through distributed shared memory. Only called with a cluster of more than one CTA.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r = 0;
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
  return r;
}

// The cluster's index along x in the grid of clusters (a split row's row): no division of blockIdx.x
// by the cluster size (~24 instructions a warp, run by every warp).
__device__ __forceinline__ uint32_t cluster_id_x() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  uint32_t c;
  asm("mov.u32 %0, %%clusterid.x;" : "=r"(c));
  return c;
#else
  return blockIdx.x;  // (no clusters: each CTA is one)
#endif
}

// Barrier over every thread of every CTA of the cluster, with release/acquire semantics for
// shared memory (it is also a CTA-wide barrier).
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __syncthreads();
#endif
}

// Read the word at `p` (an address in this CTA's shared memory) in the shared memory of cluster
// CTA `rank`, where the same variable sits at the same offset.
__device__ __forceinline__ uint32_t cluster_load(const uint32_t* p, uint32_t rank) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  uint32_t remote;
  uint32_t v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(remote) : "memory");
  return v;
#else
  (void)rank;
  return *p;
#endif
}

// Atomic add of `v` to the word at `p` (an address in this CTA's shared memory) in the shared memory
// of cluster CTA `rank`; returns the old value.
__device__ __forceinline__ uint32_t cluster_atomic_add(uint32_t* p, uint32_t v, uint32_t rank) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  uint32_t remote;
  uint32_t old;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("atom.shared::cluster.add.u32 %0, [%1], %2;" : "=r"(old) : "r"(remote), "r"(v) : "memory");
  return old;
#else
  (void)rank;
  return atomicAdd(p, v);
#endif
}

// Store `v` to the word at `p` (an address in this CTA's shared memory) in cluster CTA `rank`.
__device__ __forceinline__ void cluster_store(uint32_t* p, uint32_t v, uint32_t rank) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("st.shared::cluster.u32 [%0], %1;" ::"r"(remote), "r"(v) : "memory");
#else
  (void)rank;
  *p = v;
#endif
}

// Exchanges between a cluster's CTAs without a cluster barrier: remote stores (st.async) that
// complete their bytes on an mbarrier of the receiving CTA, which waits on it. barrier.cluster with
// release semantics compiles to MEMBAR.ALL.GPU, which waits for every outstanding memory access of
// the thread (1x131072's three exchanges took ~4 of its ~18 us, H200 phase stamps).
// The cluster shared-memory address of `p` (an address in this CTA's shared memory) in CTA `rank`.
__device__ __forceinline__ uint32_t cluster_addr(const void* p, uint32_t rank) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
#else
  (void)p;
  (void)rank;
  return 0u;
#endif
}

// Initialise this CTA's exchange barrier (one thread): one arrival (its own xbar_expect) a phase.
// Other CTAs may use it once cluster_wait() has followed this CTA's cluster_arrive_relaxed().
__device__ __forceinline__ void xbar_init(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  const uint32_t b = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n\tfence.mbarrier_init.release.cluster;" ::"r"(b) : "memory");
#endif
}
// The cluster barrier split in two, with no memory ordering: arrive early, wait late.
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
// Arrive with release semantics (this thread's earlier accesses, remote ones included, are complete
// for whoever waits on the phase); the thread may then exit without waiting.
__device__ __forceinline__ void cluster_arrive_release() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
}
// This CTA's arrival on its own barrier, expecting `bytes` from st_async (one thread, once a phase).
__device__ __forceinline__ void xbar_expect(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  const uint32_t b = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes) : "memory");
#endif
}
// Wait until phase `parity` of this CTA's barrier completed: its arrival and every byte it expects
// are in (acquire at cluster scope: the bytes are visible after).
__device__ __forceinline__ void xbar_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  const uint32_t b = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(b), "r"(parity)
        : "memory");
  } while (!done);
#endif
}
// Store v at the cluster shared-memory address `remote` (cluster_addr), completing its bytes on the
// barrier at cluster address `remote_bar` (in the same CTA).
__device__ __forceinline__ void st_async(uint32_t remote, uint32_t v, uint32_t remote_bar) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [%0], %1, [%2];" ::"r"(remote), "r"(v),
               "r"(remote_bar)
               : "memory");
#endif
}
// Store v at `p` (an address in this CTA's shared memory) in cluster CTA `rank`, completing its
// bytes on that CTA's barrier `bar` (the same variable there).
__device__ __forceinline__ void st_async(uint4* p, const uint4& v, uint32_t rank, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.u32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                   cluster_addr(p, rank)),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(cluster_addr(bar, rank))
               : "memory");
#endif
}

// Where the select stands: keys with (key & mask) > prefix are taken, keys with (key & mask) ==
// prefix are candidates of which `krem` (>= 1, <= their count) are still to be taken.
struct SelectState {
  uint32_t prefix;
  uint32_t mask;
  uint32_t krem;
  uint32_t count;  // candidates (keys equal to the prefix under the mask)
};

__device__ __forceinline__ void clear_hist(uint32_t* hist) {
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) {
    hist[b] = 0u;
  }
}

// clear_hist for a block of kBlock threads (hist 16-byte aligned): one unrolled 16-byte store a thread
// per 4 * kBlock bins. (The loop above, on blockDim.x, is 4 scalar stores and a loop's overhead a
// thread at 512 threads: ~36 instructions a warp, 4% of a 1x131072 decode row's; H200 ncu.)
template <int kBlock>
__device__ __forceinline__ void clear_hist_block(uint32_t* hist) {
  static_assert(kBins % (4 * kBlock) == 0, "whole 16-byte stores a thread");
  uint4* h = reinterpret_cast<uint4*>(hist);
#pragma unroll
  for (int i = 0; i < kBins / (4 * kBlock); ++i) {
    h[i * kBlock + int(threadIdx.x)] = make_uint4(0u, 0u, 0u, 0u);
  }
}

// After a level's histogram is complete (and a barrier): find the bin of the krem-th largest
// candidate and narrow the state to it. Ends with a barrier; `hist` may be cleared right after.
// blockDim.x must divide kBins (a power of two from 64 to 1024).
__device__ __forceinline__ void refine(const uint32_t* hist, int level, SelectState& st, SelectShared& sh) {
  const int per = kBins / blockDim.x;
  const int first = threadIdx.x * per;
  uint32_t local = 0;
  for (int b = 0; b < per; ++b) {
    local += hist[first + b];
  }
  uint32_t total;
  const uint32_t incl = block_inclusive_scan(local, sh.scan[0], total);
  uint32_t acc = total - incl;  // candidates in bins above this thread's bins
  for (int b = per - 1; b >= 0; --b) {
    const uint32_t h = hist[first + b];
    if (acc < st.krem && acc + h >= st.krem) {  // exactly one bin in the block satisfies this
      sh.bin = uint32_t(first + b);
      sh.above = acc;
      sh.count = h;
    }
    acc += h;
  }
  __syncthreads();
  const int shift = level_shift(level);
  st.prefix |= sh.bin << shift;
  st.mask = level_mask(level);
  st.krem -= sh.above;
  st.count = sh.count;
}

}  // namespace radix
}  // namespace dsa_cuda
