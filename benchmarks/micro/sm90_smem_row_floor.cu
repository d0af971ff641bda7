// Standalone (no torch) micro-benchmark for the top-k design question of notes_topk.md round 9: can
// one CTA an SM keep fp32 rows of 32K keys whole in shared memory, streamed through a ring of 16 KB
// chunks by bulk async copies (the next rows load while this one is selected), and run a radix
// histogram pass plus one threshold pass over them, near the copy floor?
//   nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/smem_row_floor benchmarks/micro/sm90_smem_row_floor.cu
//   /tmp/smem_row_floor [rows] [keys]            (default 4096 32768; keys a multiple of 4096)
// Modes, each timed by CUDA events (median of 20 launches; the 512 MB input does not fit L2):
//   load    the ring alone: wait for each chunk, read it, release it (the streaming floor of the design)
//   hist    per row: histogram of the keys' top 11 bits (sign, exponent, 2 mantissa bits) as chunks land,
//           plain shared atomics, and the threshold bin (the bin holding the k-th largest); no second pass
//   match   select (below) with the histogram's lanes of one bin adding once (__match_any_sync)
//   select  hist, then one pass writing every column above the threshold bin to global memory and
//           collecting the bin's entries in shared memory; chunks are released after that pass
//   linear  select with bins linear in value over the row's first chunk's [min, max] (clamped; NaN in
//           bin 0), so normal rows spread over all bins instead of a few dozen
// The exact finish on the threshold bin is not modelled. The select modes are checked on the host: for
// each row, keys above the bin < k <= keys above + keys in the bin (and row 0's count for the top bits).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "micro_check.h"

constexpr int kThreads = 1024;
constexpr int kChunkKeys = 4096;  // 16 KB of fp32: one float4 a thread
constexpr int kSlots = 13;        // 208 KB ring: a 32K-key row (8 chunks) plus 5 chunks of the next
constexpr int kBins = 2048;
constexpr int kCandCap = 2048;
constexpr int kSmem = kSlots * kChunkKeys * 4 + kBins * 4 + kCandCap * 4 + kSlots * 8 + 64;

__device__ __forceinline__ uint32_t saddr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ uint32_t to_key(float f) {  // order-preserving (NaN handling not modelled)
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Modes 4 and 5: bins linear in value over [lo, lo + 2048 / scale) (taken from the row's first chunk), clamped;
// monotone in the key order (NaN and values below lo in bin 0, +inf and values above in bin 2047).
// Modes 1-3: the key's top 11 bits (sign, exponent, 2 mantissa bits).
template <int kMode>
__device__ __forceinline__ uint32_t bin_of(float v, float lo, float scale) {
  if (kMode >= 4) {
    return uint32_t(fminf(fmaxf((v - lo) * scale, 0.f), 2047.f));
  }
  return to_key(v) >> 21;
}

__device__ __forceinline__ void wait_full(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(saddr(bar)), "r"(parity)
        : "memory");
  }
}

// Thread 0: chunk q (of this CTA's sequence) into its slot.
__device__ __forceinline__ void issue(const float* x, int rows, int n, int64_t q, float* ring, uint64_t* full) {
  const int chunks = n / kChunkKeys;
  const int64_t row = blockIdx.x + (q / chunks) * gridDim.x;
  if (row >= rows) {
    return;
  }
  const int slot = int(q % kSlots);
  const float* src = x + row * int64_t(n) + (q % chunks) * kChunkKeys;
  const uint32_t bytes = kChunkKeys * 4;
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic reads of the slot before the copy
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(full + slot)), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   saddr(ring + slot * kChunkKeys)),
               "l"(src), "r"(bytes), "r"(saddr(full + slot))
               : "memory");
}

template <int kMode>
__global__ void __launch_bounds__(kThreads, 1)
    rows_kernel(const float* x, int rows, int n, int k, int* out, int* above_out, int* bin_out, float* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  float* ring = reinterpret_cast<float*>(smem);
  uint32_t* hist = reinterpret_cast<uint32_t*>(ring + kSlots * kChunkKeys);
  int* cand = reinterpret_cast<int*>(hist + kBins);
  uint64_t* full = reinterpret_cast<uint64_t*>(cand + kCandCap);
  __shared__ uint32_t warp_sum[32];
  __shared__ uint32_t t_bin, t_above, n_out, n_cand;
  __shared__ float w_lo[32], w_hi[32];

  const int chunks = n / kChunkKeys;
  const int my_rows = blockIdx.x < rows ? (rows - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const int64_t total = int64_t(my_rows) * chunks;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kSlots; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(full + s)));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int64_t q = 0; q < kSlots && q < total; ++q) {
      issue(x, rows, n, q, ring, full);
    }
  }
  __syncthreads();

  for (int i = 0; i < my_rows; ++i) {
    const int64_t row = blockIdx.x + int64_t(i) * gridDim.x;
    const int64_t q0 = int64_t(i) * chunks;
    if (kMode == 0) {
      float acc = 0.f;
      for (int c = 0; c < chunks; ++c) {
        const int64_t q = q0 + c;
        wait_full(full + q % kSlots, uint32_t((q / kSlots) & 1));
        const float4 v = reinterpret_cast<const float4*>(ring + (q % kSlots) * kChunkKeys)[threadIdx.x];
        acc += v.x + v.y + v.z + v.w;
        __syncthreads();
        if (threadIdx.x == 0 && q + kSlots < total) {
          issue(x, rows, n, q + kSlots, ring, full);
        }
      }
      if (acc == 12345.f) {
        sink[row] = acc;
      }
      continue;
    }
    // Histogram, chunk by chunk as they land.
    float lo = 0.f, scale = 1.f;
    hist[2 * threadIdx.x] = 0u;
    hist[2 * threadIdx.x + 1] = 0u;
    if (threadIdx.x == 0) {
      n_out = 0u;
      n_cand = 0u;
    }
    __syncthreads();
    for (int c = 0; c < chunks; ++c) {
      const int64_t q = q0 + c;
      wait_full(full + q % kSlots, uint32_t((q / kSlots) & 1));
      const float4 v = reinterpret_cast<const float4*>(ring + (q % kSlots) * kChunkKeys)[threadIdx.x];
      const float f[4] = {v.x, v.y, v.z, v.w};
      if (kMode >= 4 && c == 0) {  // the bins' range: the first chunk's min and max (NaN ignored)
        float mn = fminf(fminf(v.x, v.y), fminf(v.z, v.w));
        float mx = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
        for (int d = 16; d > 0; d >>= 1) {
          mn = fminf(mn, __shfl_xor_sync(0xFFFFFFFFu, mn, d));
          mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, d));
        }
        if (lane == 0) {
          w_lo[warp] = mn;
          w_hi[warp] = mx;
        }
        __syncthreads();
        mn = w_lo[lane];
        mx = w_hi[lane];
        for (int d = 16; d > 0; d >>= 1) {
          mn = fminf(mn, __shfl_xor_sync(0xFFFFFFFFu, mn, d));
          mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, d));
        }
        lo = mn;
        scale = mx > mn ? 2048.f / (mx - mn) : 1.f;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t b = bin_of<kMode>(f[e], lo, scale);
        if (kMode == 3) {  // lanes of one bin add once (normal rows crowd a few dozen bins)
          const uint32_t same = __match_any_sync(0xFFFFFFFFu, b);
          if (lane == __ffs(same) - 1) {
            atomicAdd(&hist[b], uint32_t(__popc(same)));
          }
        } else {
          atomicAdd(&hist[b], 1u);
        }
      }
    }
    __syncthreads();
    // Threshold bin: thread t holds bins 2047 - 2t and 2046 - 2t (largest first); a block scan.
    const uint32_t h0 = hist[kBins - 1 - 2 * threadIdx.x];
    const uint32_t h1 = hist[kBins - 2 - 2 * threadIdx.x];
    uint32_t incl = h0 + h1;
    for (int d = 1; d < 32; d <<= 1) {
      const uint32_t o = __shfl_up_sync(0xFFFFFFFFu, incl, d);
      incl += lane >= d ? o : 0u;
    }
    if (lane == 31) {
      warp_sum[warp] = incl;
    }
    __syncthreads();
    if (warp == 0) {
      uint32_t w = warp_sum[lane];
      for (int d = 1; d < 32; d <<= 1) {
        const uint32_t o = __shfl_up_sync(0xFFFFFFFFu, w, d);
        w += lane >= d ? o : 0u;
      }
      warp_sum[lane] = w - warp_sum[lane];  // exclusive
    }
    __syncthreads();
    const uint32_t before = warp_sum[warp] + incl - (h0 + h1);
    if (before < uint32_t(k) && before + h0 >= uint32_t(k)) {
      t_bin = kBins - 1 - 2 * threadIdx.x;
      t_above = before;
    } else if (before + h0 < uint32_t(k) && before + h0 + h1 >= uint32_t(k)) {
      t_bin = kBins - 2 - 2 * threadIdx.x;
      t_above = before + h0;
    }
    __syncthreads();
    const uint32_t tb = t_bin;
    if (kMode == 1 || kMode == 5) {  // histogram and threshold bin only: release the row's chunks
      for (int c = 0; c < chunks; ++c) {
        const int64_t q = q0 + c;
        if (threadIdx.x == 0 && q + kSlots < total) {
          issue(x, rows, n, q + kSlots, ring, full);
        }
      }
      if (threadIdx.x == 0) {
        above_out[row] = int(t_above);
      }
      __syncthreads();
      continue;
    }
    // One pass: columns above the bin to `out` (warp-aggregated positions), the bin's to `cand`.
    int* out_row = out + row * int64_t(k);
    for (int c = 0; c < chunks; ++c) {
      const int64_t q = q0 + c;
      const float4 v = reinterpret_cast<const float4*>(ring + (q % kSlots) * kChunkKeys)[threadIdx.x];
      const float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t b = bin_of<kMode>(f[e], lo, scale);
        const int col = c * kChunkKeys + 4 * int(threadIdx.x) + e;
        const uint32_t up = __ballot_sync(0xFFFFFFFFu, b > tb);
        const uint32_t eq = __ballot_sync(0xFFFFFFFFu, b == tb);
        uint32_t base_up = 0, base_eq = 0;
        if (lane == 0) {
          base_up = up ? atomicAdd(&n_out, uint32_t(__popc(up))) : 0u;
          base_eq = eq ? atomicAdd(&n_cand, uint32_t(__popc(eq))) : 0u;
        }
        base_up = __shfl_sync(0xFFFFFFFFu, base_up, 0);
        base_eq = __shfl_sync(0xFFFFFFFFu, base_eq, 0);
        const uint32_t lt = (1u << lane) - 1u;
        if (b > tb) {
          out_row[base_up + __popc(up & lt)] = col;
        } else if (b == tb) {
          const uint32_t p = base_eq + __popc(eq & lt);
          if (p < kCandCap) {
            cand[p] = col;
          }
        }
      }
      __syncthreads();  // the chunk is read: release it
      if (threadIdx.x == 0 && q + kSlots < total) {
        issue(x, rows, n, q + kSlots, ring, full);
      }
    }
    if (threadIdx.x == 0) {
      above_out[row] = int(n_out);
      bin_out[row] = int(n_cand);
    }
  }
}

int main(int argc, char** argv) {
  const int rows = argc > 1 ? std::atoi(argv[1]) : 4096;
  const int n = argc > 2 ? std::atoi(argv[2]) : 32768;
  const int k = 2048;
  if (n % kChunkKeys != 0 || n / kChunkKeys > kSlots) {
    std::fprintf(stderr, "keys must be a multiple of %d, at most %d\n", kChunkKeys, kSlots * kChunkKeys);
    return 2;
  }
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t bytes = size_t(rows) * n * 4;
  std::vector<float> h(size_t(rows) * n);
  std::mt19937 rng(0);
  std::normal_distribution<float> nd;
  for (auto& v : h) v = nd(rng);
  float *x, *sink, *copy;
  int *out, *above, *bin;
  CHECK(cudaMalloc(&x, bytes));
  CHECK(cudaMalloc(&copy, bytes));
  CHECK(cudaMalloc(&sink, rows * 4));
  CHECK(cudaMalloc(&out, size_t(rows) * k * 4));
  CHECK(cudaMalloc(&above, rows * 4));
  CHECK(cudaMalloc(&bin, rows * 4));
  CHECK(cudaMemcpy(x, h.data(), bytes, cudaMemcpyHostToDevice));
  for (auto kern : {rows_kernel<0>, rows_kernel<1>, rows_kernel<2>, rows_kernel<3>, rows_kernel<4>, rows_kernel<5>}) {
    CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  }
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  auto median_us = [&](auto launch) {
    std::vector<float> t;
    for (int r = 0; r < 23; ++r) {
      CHECK(cudaEventRecord(e0));
      launch();
      CHECK(cudaEventRecord(e1));
      CHECK(cudaEventSynchronize(e1));
      float ms = 0.f;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (r >= 3) t.push_back(ms * 1000.f);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const float copy_us = median_us([&] { CHECK(cudaMemcpyAsync(copy, x, bytes, cudaMemcpyDeviceToDevice)); });
  const double gbps = 2.0 * bytes / (copy_us * 1e3);
  const double floor_us = (bytes + size_t(rows) * k * 4) / (gbps * 1e3);
  const float load_us = median_us([&] { rows_kernel<0><<<sms, kThreads, kSmem>>>(x, rows, n, k, out, above, bin, sink); });
  const float hist_us = median_us([&] { rows_kernel<1><<<sms, kThreads, kSmem>>>(x, rows, n, k, out, above, bin, sink); });
  const float match_us = median_us([&] { rows_kernel<3><<<sms, kThreads, kSmem>>>(x, rows, n, k, out, above, bin, sink); });
  const float lin_hist_us = median_us([&] { rows_kernel<5><<<sms, kThreads, kSmem>>>(x, rows, n, k, out, above, bin, sink); });
  const float lin_us = median_us([&] { rows_kernel<4><<<sms, kThreads, kSmem>>>(x, rows, n, k, out, above, bin, sink); });
  CHECK(cudaGetLastError());
  const float sel_us = median_us([&] { rows_kernel<2><<<sms, kThreads, kSmem>>>(x, rows, n, k, out, above, bin, sink); });
  CHECK(cudaGetLastError());
  // Check a select mode's per-row counts: keys above the bin < k <= above + in the bin; row 0 on the host.
  std::vector<uint32_t> keys0(n);
  for (int j = 0; j < n; ++j) {
    uint32_t u;
    std::memcpy(&u, &h[j], 4);
    keys0[j] = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  }
  std::vector<uint32_t> sorted0 = keys0;
  std::sort(sorted0.begin(), sorted0.end(), std::greater<uint32_t>());
  int up0 = 0;
  for (uint32_t key : keys0) up0 += (key >> 21) > (sorted0[k - 1] >> 21);
  long long bin_sum = 0;
  auto failing = [&](bool top_bits) {  // (row 0's host check: for the top-11-bit bins only)
    CHECK(cudaDeviceSynchronize());
    std::vector<int> ha(rows), hb(rows);
    CHECK(cudaMemcpy(ha.data(), above, rows * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hb.data(), bin, rows * 4, cudaMemcpyDeviceToHost));
    int bad = top_bits && ha[0] != up0;
    bin_sum = 0;
    for (int r = 0; r < rows; ++r) {
      bad += !(ha[r] < k && ha[r] + hb[r] >= k);
      bin_sum += hb[r];
    }
    return bad;
  };
  CHECK(cudaMemset(above, 0xFF, rows * 4));
  rows_kernel<3><<<sms, kThreads, kSmem>>>(x, rows, n, k, out, above, bin, sink);
  const int bad_match = failing(true);
  CHECK(cudaMemset(above, 0xFF, rows * 4));
  rows_kernel<4><<<sms, kThreads, kSmem>>>(x, rows, n, k, out, above, bin, sink);
  const int bad_lin = failing(false);
  const double lin_bin = double(bin_sum) / rows;
  CHECK(cudaMemset(above, 0xFF, rows * 4));
  rows_kernel<2><<<sms, kThreads, kSmem>>>(x, rows, n, k, out, above, bin, sink);
  const int bad = failing(true) + bad_match + bad_lin;
  std::printf("%dx%d fp32 k=%d, %d CTAs x %d threads, ring %d x 16 KB: copy %.1f us (%.0f GB/s), floor %.1f us\n",
              rows, n, k, sms, kThreads, kSlots, copy_us, gbps, floor_us);
  std::printf("  load   %.1f us (%.2fx floor)\n", load_us, load_us / floor_us);
  std::printf("  hist   %.1f us (%.2fx floor): histogram of the top 11 bits (plain shared atomics) and the threshold bin\n",
              hist_us, hist_us / floor_us);
  std::printf("  match  %.1f us (%.2fx floor): select with the histogram's lanes of one bin adding once (match.any)\n",
              match_us, match_us / floor_us);
  std::printf("  select %.1f us (%.2fx floor), threshold-bin entries a row %.1f, rows failing the check: %d (match: %d)\n",
              sel_us, sel_us / floor_us, double(bin_sum) / rows, bad - bad_match - bad_lin, bad_match);
  std::printf("  linear %.1f us (%.2fx floor), histogram only %.1f us: bins linear in value over the first chunk's range; "
              "threshold-bin entries a row %.1f, rows failing the check: %d\n",
              lin_us, lin_us / floor_us, lin_hist_us, lin_bin, bad_lin);
  return bad != 0;
}
