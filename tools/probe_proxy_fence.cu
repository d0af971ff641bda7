// Dev tool (GPU, plain nvcc): does fence.proxy.async.shared::cta wait for the thread's global loads in flight?
// nvcc 13.0 compiles it to MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S, and sparse_mla_decode's producer fences each tile's
// stores (before its `full` arrive) just after issuing the next tile's refills: if the MEMBAR waits for those
// loads, every tile's hand-over to the math waits a gather's round trip (docs/design_attention.md, Next).
//
//   nvcc -O3 -std=c++17 -Ibackends_cuda/include -gencode=arch=compute_90a,code=sm_90a -o /tmp/probe_proxy_fence \
//     tools/probe_proxy_fence.cu
//   /tmp/probe_proxy_fence
//
// 132 CTAs of 128 threads; each thread issues 16 LDG.128 of lines 1 KB apart after an L2 flush (.nc, evict_last:
// the producer's refills), stores to shared memory, then (mode 1) fences, and arrives on an mbarrier (which waits
// for the fence, as the kernel's arrive does), timing load issue -> after the arrive with clock64; the loads are
// used only afterwards. Mode 0: no fence. Mode 2: the fence before the loads are issued. Mode 1 far above mode 0
// says the fence waits for loads in flight (H100: 17-20k cycles against 0.3-0.6k, the loads' use at 52-55k;
// benchmarks/results/h100_mla_fence_first.log).
#include <cstdint>
#include <cstdio>

#include "dsa_cuda/smxx_mbarrier.cuh"         // the kernel's mbar_init / mbar_arrive
#include "dsa_cuda/smxx_sparse_mla_decode.cuh"  // its refill load (ldg128) and fence (fence_async_smem)

__global__ void probe(const uint4* src, unsigned long long* cycles, uint32_t* sink, int mode, int stride) {
#if DSA_SMXX_MLA_DEVICE
  using dsa_cuda::smxx::mbar_arrive;
  using dsa_cuda::smxx::mbar_init;
  using dsa_cuda::smxx_mla_decode::fence_async_smem;
  using dsa_cuda::smxx_mla_decode::Ldg;
  using dsa_cuda::smxx_mla_decode::ldg128;
  __shared__ uint4 s[256];
  __shared__ uint64_t bar;
  const int t = threadIdx.x;
  const uint32_t bar_addr = uint32_t(__cvta_generic_to_shared(&bar));
  if (t == 0) {
    mbar_init(bar_addr, 1u << 16);  // never completes: 128 arrivals (the count's limit is 2^20 - 1)
  }
  const uint4* base = src + (size_t(blockIdx.x) * 128 + t) * 16 * size_t(stride);
  s[t] = make_uint4(t, 0, 0, 0);
  __syncthreads();
  if (mode == 2) {
    fence_async_smem();
  }
  const long long t0 = clock64();
  uint4 v[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    v[i] = ldg128<Ldg::kKeep>(reinterpret_cast<const uint8_t*>(base + i * stride));
  }
  s[128 + t] = make_uint4(t, 1, 2, 3);
  if (mode == 1) {
    fence_async_smem();
  }
  mbar_arrive(bar_addr);
  const long long t1 = clock64();
  uint32_t acc = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    acc += v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  }
  const long long t2 = clock64();
  sink[blockIdx.x * 128 + t] = acc + s[(t + 1) % 128].x;
  if (t == 0) {
    cycles[blockIdx.x * 2] = t1 - t0;
    cycles[blockIdx.x * 2 + 1] = t2 - t0;
  }
#endif
}

int main() {
  const int blocks = 132, stride = 64;  // 16-byte units: lines 1 KB apart
  const size_t n = size_t(blocks) * 128 * 16 * stride;
  uint4* src = nullptr;
  unsigned long long* cycles = nullptr;
  uint32_t* sink = nullptr;
  char* flush = nullptr;
  cudaMalloc(&src, n * sizeof(uint4));
  cudaMemset(src, 1, n * sizeof(uint4));
  cudaMallocManaged(&cycles, blocks * 2 * sizeof(unsigned long long));
  cudaMalloc(&sink, blocks * 128 * sizeof(uint32_t));
  cudaMalloc(&flush, size_t(256) << 20);
  const char* names[] = {"no fence", "fence after loads", "fence before loads"};
  for (int rep = 0; rep < 2; ++rep) {
    for (int mode = 0; mode < 3; ++mode) {
      cudaMemset(flush, rep + mode, size_t(256) << 20);  // evict L2
      probe<<<blocks, 128>>>(src, cycles, sink, mode, stride);
      const cudaError_t e = cudaDeviceSynchronize();
      double arrive = 0, used = 0;
      for (int i = 0; i < blocks; ++i) {
        arrive += double(cycles[2 * i]);
        used += double(cycles[2 * i + 1]);
      }
      printf("mode %d (%s): issue->after fence %.0f cycles, issue->loads used %.0f (%s)\n", mode, names[mode],
             arrive / blocks, used / blocks, cudaGetErrorString(e));
    }
  }
  return 0;
}
