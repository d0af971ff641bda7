// Standalone (no torch) micro-benchmark for the top-k design question of notes_topk.md round 15: what
// bounds the gather of a decode row's candidates into rank 0 of its cluster (~5600 candidates from 8 CTAs
// took ~1.5 us, H200 globaltimer stamps): the bytes into one SM, the number of st.async messages, or
// their latency? And how fast is the same traffic spread over every SM of the cluster? (Run on the H200 in
// the fifteenth session: figures and reading in notes_topk.md round 16.)
//   nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/dsmem_push benchmarks/micro/sm90_dsmem_push.cu
//   /tmp/dsmem_push [entries a sender] [clusters]      (default 700 1; 700 is 1x131072's ~5600 / 8)
// Clusters of 8 CTAs of 512 threads. After a cluster barrier, every CTA stamps %globaltimer, sends its
// messages, waits on its own mbarrier for every byte it expects, and stamps again; the printed figure is
// the median over clusters and launches of the slowest receiving CTA's time (ns). Modes:
//   gather4    ranks 1-7 push n 4-byte entries each into rank 0 (keys alone)
//   gather8    the same n entries as two 4-byte messages each (key and column: what main does)
//   gather16   the n entries as 16-byte messages (4 entries a message)
//   spread4    every CTA pushes n / 7 4-byte entries to each of the other 7 (the same bytes a sender,
//              each SM receiving an eighth of gather4's)
//   spread16   spread4 as 16-byte messages
// Each receiver checks what landed against what was sent (the exit code is 1 on a mismatch).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "micro_check.h"

constexpr int kCtas = 8;
constexpr int kThreads = 512;
constexpr int kMaxEntries = 2048;                          // a sender's entries at most
constexpr int kRecvWords = 2 * kMaxEntries * (kCtas - 1);  // gather8 into rank 0: (key, column) each
constexpr int kRecvBytes = kRecvWords * 4;                 // dynamic shared memory (112 KB)

enum Mode { kGather4, kGather8, kGather16, kSpread4, kSpread16, kModes };
const char* const kModeNames[kModes] = {"gather4", "gather8", "gather16", "spread4", "spread16"};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ uint32_t remote_addr(const void* p, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_addr(p)), "r"(rank));
  return r;
}
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void push4(uint32_t to, uint32_t v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [%0], %1, [%2];" ::"r"(to), "r"(v),
               "r"(bar)
               : "memory");
}
__device__ __forceinline__ void push16(uint32_t to, uint4 v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.u32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                   to),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar)
               : "memory");
}

// The value of entry i of sender s (its key; its column is ~value).
__device__ __host__ __forceinline__ uint32_t value_of(uint32_t s, uint32_t i) { return (s << 24) ^ (i * 2654435761u); }

template <Mode kMode>
__global__ void __cluster_dims__(kCtas, 1, 1) __launch_bounds__(kThreads, 1)
    push_kernel(int n, unsigned long long* ns, int* bad) {
  extern __shared__ __align__(16) uint32_t recv[];
  __shared__ alignas(8) uint64_t bar;
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  constexpr bool kSpread = kMode == kSpread4 || kMode == kSpread16;
  // Spread: each CTA sends n / 7 (rounded down to 4) entries to each other CTA.
  const uint32_t per_peer = kSpread ? (uint32_t(n) / (kCtas - 1)) & ~3u : 0u;
  const uint32_t words_per_entry = kMode == kGather8 ? 2u : 1u;
  const uint32_t sent = kMode == kGather16 ? uint32_t(n) & ~3u : uint32_t(n);  // a gather sender's entries
  uint32_t expect = 0;
  if (kSpread) {
    expect = 4u * per_peer * (kCtas - 1);
  } else if (rank == 0) {
    expect = 4u * words_per_entry * sent * (kCtas - 1);
  }
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n\tfence.mbarrier_init.release.cluster;" ::"r"(smem_addr(&bar))
                 : "memory");
  }
  cluster_sync_all();  // every CTA's barrier is initialised
  const uint64_t t0 = now_ns();
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(&bar)), "r"(expect)
                 : "memory");
  }
  if constexpr (kSpread) {  // sender `rank` writes into slot (rank < peer ? rank : rank - 1) of each peer
    for (uint32_t peer = 0; peer < kCtas; ++peer) {
      if (peer == rank) {
        continue;
      }
      const uint32_t slot = rank < peer ? rank : rank - 1;
      uint32_t* dst = recv + slot * per_peer;
      const uint32_t rbar = remote_addr(&bar, peer);
      if constexpr (kMode == kSpread4) {
        for (uint32_t i = threadIdx.x; i < per_peer; i += kThreads) {
          push4(remote_addr(dst + i, peer), value_of(rank, peer * per_peer + i), rbar);
        }
      } else {
        for (uint32_t q = threadIdx.x; q < per_peer / 4; q += kThreads) {
          const uint32_t i = 4 * q + peer * per_peer;
          push16(remote_addr(dst + 4 * q, peer),
                 make_uint4(value_of(rank, i), value_of(rank, i + 1), value_of(rank, i + 2), value_of(rank, i + 3)),
                 rbar);
        }
      }
    }
  } else if (rank != 0) {  // sender `rank` writes its entries after those of ranks 1 .. rank - 1
    const uint32_t first = (rank - 1) * uint32_t(n);
    const uint32_t rbar = remote_addr(&bar, 0);
    if (kMode == kGather16) {
      for (uint32_t q = threadIdx.x; q < uint32_t(n) / 4; q += kThreads) {
        const uint32_t i = 4 * q;
        push16(remote_addr(recv + first + i, 0),
               make_uint4(value_of(rank, i), value_of(rank, i + 1), value_of(rank, i + 2), value_of(rank, i + 3)), rbar);
      }
    } else {
      for (uint32_t i = threadIdx.x; i < uint32_t(n); i += kThreads) {
        push4(remote_addr(recv + first + i, 0), value_of(rank, i), rbar);
        if (kMode == kGather8) {
          push4(remote_addr(recv + (kCtas - 1) * uint32_t(n) + first + i, 0), ~value_of(rank, i), rbar);
        }
      }
    }
  }
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(smem_addr(&bar))
        : "memory");
  } while (!done);
  __syncthreads();
  const uint64_t t1 = now_ns();
  // Check what landed.
  int wrong = 0;
  if constexpr (kSpread) {
    for (uint32_t j = threadIdx.x; j < per_peer * (kCtas - 1); j += kThreads) {
      const uint32_t slot = j / per_peer;
      const uint32_t s = slot < rank ? slot : slot + 1;
      wrong |= recv[j] != value_of(s, rank * per_peer + j % per_peer);
    }
  } else if (rank == 0) {
    const uint32_t m = sent;
    for (uint32_t j = threadIdx.x; j < (kCtas - 1) * uint32_t(n); j += kThreads) {
      const uint32_t s = 1 + j / uint32_t(n);
      const uint32_t i = j % uint32_t(n);
      if (i < m) {
        wrong |= recv[j] != value_of(s, i);
        if (kMode == kGather8) {
          wrong |= recv[(kCtas - 1) * uint32_t(n) + j] != ~value_of(s, i);
        }
      }
    }
  }
  if (wrong) {
    atomicAdd(bad, 1);
  }
  if (threadIdx.x == 0) {
    ns[blockIdx.x] = t1 - t0;
  }
  cluster_sync_all();  // no CTA leaves while a peer may still write into it
}

template <Mode kMode>
double run(int n, int clusters, unsigned long long* ns, int* bad) {
  const int ctas = clusters * kCtas;
  std::vector<unsigned long long> h(ctas);
  std::vector<double> worst;
  CHECK(cudaFuncSetAttribute(push_kernel<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize, kRecvBytes));
  for (int launch = 0; launch < 21; ++launch) {
    push_kernel<kMode><<<ctas, kThreads, kRecvBytes>>>(n, ns, bad);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(h.data(), ns, ctas * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    if (launch == 0) {
      continue;  // (warm-up)
    }
    for (int c = 0; c < clusters; ++c) {
      // gather: rank 0's time (the receiver); spread: the slowest CTA's
      unsigned long long w = h[c * kCtas];
      if (kMode == kSpread4 || kMode == kSpread16) {
        w = *std::max_element(h.begin() + c * kCtas, h.begin() + (c + 1) * kCtas);
      }
      worst.push_back(double(w));
    }
  }
  std::sort(worst.begin(), worst.end());
  return worst[worst.size() / 2];
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 700;
  const int clusters = argc > 2 ? std::atoi(argv[2]) : 1;
  if (n < 4 || n > kMaxEntries || clusters < 1 || clusters > 16) {
    std::fprintf(stderr, "entries a sender: 4 .. %d; clusters: 1 .. 16\n", kMaxEntries);
    return 2;
  }
  unsigned long long* ns = nullptr;
  int* bad = nullptr;
  CHECK(cudaMalloc(&ns, clusters * kCtas * sizeof(unsigned long long)));
  CHECK(cudaMalloc(&bad, sizeof(int)));
  CHECK(cudaMemset(bad, 0, sizeof(int)));
  const double t[kModes] = {run<kGather4>(n, clusters, ns, bad), run<kGather8>(n, clusters, ns, bad),
                            run<kGather16>(n, clusters, ns, bad), run<kSpread4>(n, clusters, ns, bad),
                            run<kSpread16>(n, clusters, ns, bad)};
  int h_bad = 0;
  CHECK(cudaMemcpy(&h_bad, bad, sizeof(int), cudaMemcpyDeviceToHost));
  // Bytes into the receiving SM (gather: rank 0; spread: each CTA, all at once).
  const double per_peer = double((n / (kCtas - 1)) & ~3);
  const double bytes[kModes] = {4.0 * n * (kCtas - 1), 8.0 * n * (kCtas - 1), 4.0 * (n & ~3) * (kCtas - 1),
                                4.0 * per_peer * (kCtas - 1), 4.0 * per_peer * (kCtas - 1)};
  std::printf("entries a sender %d, clusters %d (median ns on the receiving side)\n", n, clusters);
  for (int m = 0; m < kModes; ++m) {
    std::printf("  %-9s %8.0f ns  %7.0f bytes into %s  %6.1f GB/s\n", kModeNames[m], t[m], bytes[m],
                m >= kSpread4 ? "each SM" : "rank 0's SM", bytes[m] / t[m]);
  }
  std::printf(h_bad == 0 ? "check: every landed entry matches\n" : "check: %d CTAs saw wrong entries\n", h_bad);
  return h_bad == 0 ? 0 : 1;
}
