// The filter kernel of the top-k family (deterministic=False): exact, outputs in any order.
// Torch-free: the compile gates build this file alone with nvcc.
//
// One CTA of 512 threads per row (two per SM), or a thread-block cluster per row when few long
// rows would leave SMs idle. Keys are the order-preserving uint32 of common_radix_select.cuh.
//
// Fast path, one read of the row:
//   1. Sample: kSamples evenly spaced keys give a threshold E such that about 2k to 4k keys of the
//      window are >= E (E = 0, every key, when the window fits the candidate buffer).
//   2. Filter: one pass over device memory appends every key >= E, with its column, to a
//      shared-memory candidate buffer (warp-aggregated atomics; a split row's CTAs each fill their
//      own and the cluster's rank 0 gathers them through distributed shared memory).
//   3. Finish: when k <= candidates <= capacity, a radix select on the candidates finds the k-th
//      largest key T; the keys > T and, among the keys == T, the smallest columns (a second radix
//      select, on columns) are written.
// Exact fallback (the sample missed: fewer than k or too many candidates; one CTA, the whole
// window): radix levels over device memory until the threshold bin fits the buffer, one pass that
// writes the keys above the bin and gathers the bin, and the finish of step 3 on the bin. When the
// bin never fits (more than `capacity` keys equal to the k-th largest: plateaus, all-equal rows),
// an ordered pass takes the first ties in index order and stops once it has enough.
#include "dsa_cuda/common_launch.cuh"
#include "dsa_cuda/common_radix_select.cuh"
#include "dsa_cuda/common_topk_row.cuh"
#include "dsa_cuda/sm90_topk_heuristics.cuh"
#include "dsa_cuda/topk.cuh"

namespace dsa_cuda {
namespace topk_filter_detail {

using namespace topk_row;  // KernelArgs, RowOut, GlobalSrc, hist_add, hist_pass, row_window, ...

constexpr int kThreads = 512;
// Candidate (key, column) pairs in shared memory: with the histogram, two CTAs fit on an SM.
constexpr int kCapacity = 12288;
constexpr int kSamples = 2048;  // <= kCapacity: the samples sit in the candidate buffer
constexpr int kDynSmem = radix::kBins * 4 + kCapacity * 8;

struct Counters {
  uint32_t cand;  // candidates appended (stored while < kCapacity)
  uint32_t out;   // outputs written
  uint32_t ok;    // split rows: rank 0 gathered every candidate
};

__device__ __forceinline__ uint32_t lanemask_lt() { return (1u << (threadIdx.x & 31)) - 1u; }

// Write `col` at the next free output position for every lane with `take` (one shared atomic per
// warp). The warp must be converged.
__device__ __forceinline__ void emit(bool take, int64_t col, const RowOut& o, uint32_t* counter, uint32_t k) {
  const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, take);
  if (ballot == 0u) {
    return;
  }
  const int leader = __ffs(ballot) - 1;
  uint32_t base = 0;
  if (int(threadIdx.x & 31) == leader) {
    base = atomicAdd(counter, uint32_t(__popc(ballot)));
  }
  base = __shfl_sync(0xFFFFFFFFu, base, leader);
  const uint32_t pos = base + uint32_t(__popc(ballot & lanemask_lt()));
  if (take && pos < k) {  // pos < k always holds; the guard keeps a bug from writing past the row
    o.put(pos, col);
  }
}

// Reserve `n` consecutive candidate slots per lane (one shared atomic per warp); returns the first.
// The warp must be converged.
__device__ __forceinline__ uint32_t reserve(uint32_t n, uint32_t* counter) {
  if (__ballot_sync(0xFFFFFFFFu, n != 0u) == 0u) {
    return 0u;
  }
  uint32_t incl = n;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t t = __shfl_up_sync(0xFFFFFFFFu, incl, o);
    if (int(threadIdx.x & 31) >= o) {
      incl += t;
    }
  }
  uint32_t base = 0;
  if ((threadIdx.x & 31) == 31) {
    base = atomicAdd(counter, incl);
  }
  base = __shfl_sync(0xFFFFFFFFu, base, 31);
  return base + incl - n;
}

// A list of values in shared memory to select on: the candidates' keys, or their inverted columns
// restricted to the keys equal to `tie` (so the largest values are the smallest columns).
struct KeyList {
  const uint32_t* keys;
  __device__ __forceinline__ bool valid(int) const { return true; }
  __device__ __forceinline__ uint32_t value(int i) const { return keys[i]; }
};
struct TieColumnList {
  const uint32_t* keys;
  const int32_t* cols;
  uint32_t tie;
  __device__ __forceinline__ bool valid(int i) const { return keys[i] == tie; }
  __device__ __forceinline__ uint32_t value(int i) const { return ~uint32_t(cols[i]); }
};

// Narrow `st` over the m list entries until every entry left in the bin is taken (count == krem)
// or all 32 bits are fixed. st starts as {0, 0, r, valid entries}. Ends with a barrier.
template <class List>
__device__ __forceinline__ void select_list(const List& list, int m, SelectState& st, uint32_t* hist,
                                            SelectShared& sh) {
  for (int level = 0; level < radix::kLevels && st.count != st.krem; ++level) {
    radix::clear_hist(hist);
    __syncthreads();
    const int shift = radix::level_shift(level);
    for (int base = 0; base < m; base += int(blockDim.x)) {
      const int i = base + int(threadIdx.x);
      const bool in = i < m && list.valid(i);
      const uint32_t v = in ? list.value(i) : 0u;
      hist_add(hist, in && (v & st.mask) == st.prefix, (v >> shift) & 0x7FFu);
    }
    __syncthreads();
    radix::refine(hist, level, st, sh);
  }
}

// Whether `v` is taken under a finished select: above the prefix, or in its bin when the whole
// bin is taken.
__device__ __forceinline__ bool above(uint32_t v, const SelectState& st) { return (v & st.mask) > st.prefix; }
__device__ __forceinline__ bool taken(uint32_t v, const SelectState& st) {
  return above(v, st) || ((v & st.mask) == st.prefix && st.count == st.krem);
}

// The r largest of the m candidates (ties: smallest columns) to the output.
__device__ __forceinline__ void finish(const uint32_t* keys, const int32_t* cols, int m, uint32_t r,
                                       const RowOut& o, uint32_t* hist, Counters& cnt, uint32_t k,
                                       SelectShared& sh) {
  SelectState ks{0u, 0u, r, uint32_t(m)};
  select_list(KeyList{keys}, m, ks, hist, sh);
  SelectState cs{0u, 0u, 0u, 0u};
  const bool split_ties = ks.count != ks.krem;  // all 32 bits fixed; more keys == T than needed
  if (split_ties) {
    cs = SelectState{0u, 0u, ks.krem, ks.count};
    select_list(TieColumnList{keys, cols, ks.prefix}, m, cs, hist, sh);
  }
  for (int base = 0; base < m; base += int(blockDim.x)) {
    const int i = base + int(threadIdx.x);
    bool take = false;
    int32_t col = 0;
    if (i < m) {
      const uint32_t key = keys[i];
      col = cols[i];
      take = taken(key, ks) || (split_ties && key == ks.prefix && taken(~uint32_t(col), cs));
    }
    emit(take, col, o, &cnt.out, k);
  }
}

// A threshold E such that about `want` (to 2 * want) keys of the window are >= E, from kSamples
// evenly spaced keys. Uses `buf` (kSamples words) and `hist`. Ends with a barrier.
template <typename T>
__device__ __forceinline__ uint32_t sample_threshold(const T* row, int64_t lo, int64_t n, uint32_t want,
                                                     uint32_t* buf, uint32_t* hist, SelectShared& sh) {
  for (int i = threadIdx.x; i < kSamples; i += blockDim.x) {
    buf[i] = radix::KeyOf<T>::one(row + lo + (int64_t(i) * n + n / 2) / kSamples);
  }
  uint64_t j = (uint64_t(kSamples) * want + uint64_t(n) - 1) / uint64_t(n);
  j = j < 1 ? 1 : (j > uint64_t(kSamples) ? uint64_t(kSamples) : j);
  SelectState st{0u, 0u, uint32_t(j), uint32_t(kSamples)};
  for (int level = 0; level < radix::kLevels; ++level) {
    radix::clear_hist(hist);
    __syncthreads();  // (the first one also publishes the samples)
    const int shift = radix::level_shift(level);
    for (int base = 0; base < kSamples; base += int(blockDim.x)) {
      const uint32_t v = buf[base + threadIdx.x];
      hist_add(hist, (v & st.mask) == st.prefix, (v >> shift) & 0x7FFu);
    }
    __syncthreads();
    radix::refine(hist, level, st, sh);
    // Samples >= the bin's lower edge: those above the bin plus the bin. Close enough: stop.
    if ((uint32_t(j) - st.krem) + st.count <= 2 * uint32_t(j)) {
      break;
    }
  }
  return st.prefix;  // the lower edge of the bin (its unfixed bits are 0)
}

// Append every key >= E of the part, with its column, to the candidates. Returns nothing; the
// count is in cnt.cand (keys past kCapacity are counted, not stored).
template <typename T>
__device__ __forceinline__ void filter_pass(const GlobalSrc<T>& g, uint32_t E, uint32_t* keys, int32_t* cols,
                                            Counters& cnt) {
  constexpr int I = GlobalSrc<T>::kItems;
  constexpr int U = 16 / I;  // 16 keys per thread per round: several loads in flight
  const int per_round = U * int(blockDim.x);
  const int32_t rounds = vec_rounds(g, per_round);
  for (int32_t r = 0; r < rounds; ++r) {
    uint32_t key[U][I];
    uint32_t m[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int32_t v = r * per_round + u * int(blockDim.x) + int(threadIdx.x);
      m[u] = 0u;
#pragma unroll
      for (int j = 0; j < I; ++j) {
        key[u][j] = 0u;
      }
      if (v < g.vecs) {
        m[u] = g.load(v, key[u]);
      }
    }
    uint32_t n = 0;
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int j = 0; j < I; ++j) {
        const bool pass = ((m[u] >> j) & 1u) && key[u][j] >= E;
        m[u] = (m[u] & ~(1u << j)) | (uint32_t(pass) << j);
        n += uint32_t(pass);
      }
    }
    uint32_t pos = reserve(n, &cnt.cand);
    if (n != 0u) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int32_t v = r * per_round + u * int(blockDim.x) + int(threadIdx.x);
#pragma unroll
        for (int j = 0; j < I; ++j) {
          if ((m[u] >> j) & 1u) {
            if (pos < uint32_t(kCapacity)) {
              keys[pos] = key[u][j];
              cols[pos] = int32_t(g.col(v, j));
            }
            ++pos;
          }
        }
      }
    }
  }
}

// After the levels: every key above the prefix to the output; the keys in the bin to the
// candidates (`gather`), to the output (`take_bin`: the whole bin is taken), or nowhere.
template <typename T>
__device__ __forceinline__ void gather_pass(const GlobalSrc<T>& g, const SelectState& st, bool gather, bool take_bin,
                                            uint32_t* keys, int32_t* cols, Counters& cnt, const RowOut& o,
                                            uint32_t k) {
  constexpr int I = GlobalSrc<T>::kItems;
  const int32_t rounds = vec_rounds(g, int(blockDim.x));
  for (int32_t r = 0; r < rounds; ++r) {
    const int32_t v = r * int(blockDim.x) + int(threadIdx.x);
    uint32_t key[I] = {};
    const uint32_t m = v < g.vecs ? g.load(v, key) : 0u;
    uint32_t in_bin = 0;
#pragma unroll
    for (int j = 0; j < I; ++j) {
      const bool live = (m >> j) & 1u;
      const uint32_t mk = key[j] & st.mask;
      emit(live && (mk > st.prefix || (take_bin && mk == st.prefix)), g.col(v, j), o, &cnt.out, k);
      in_bin |= uint32_t(live && gather && mk == st.prefix) << j;
    }
    uint32_t pos = reserve(uint32_t(__popc(in_bin)), &cnt.cand);
#pragma unroll
    for (int j = 0; j < I; ++j) {
      if ((in_bin >> j) & 1u) {
        if (pos < uint32_t(kCapacity)) {
          keys[pos] = key[j];
          cols[pos] = int32_t(g.col(v, j));
        }
        ++pos;
      }
    }
  }
}

// The first `need` keys equal to `tie` in index order to the output positions pos0, pos0 + 1, ...
// Stops once it has them. Ends with a barrier.
template <typename T>
__device__ __forceinline__ void ordered_ties(const GlobalSrc<T>& g, uint32_t tie, uint32_t need, uint32_t pos0,
                                             const RowOut& o, uint32_t k, SelectShared& sh) {
  constexpr int I = GlobalSrc<T>::kItems;
  const int32_t rounds = vec_rounds(g, int(blockDim.x));
  uint32_t run = 0;
  for (int32_t r = 0; r < rounds && run < need; ++r) {
    const int32_t v = r * int(blockDim.x) + int(threadIdx.x);
    uint32_t key[I] = {};
    const uint32_t m = v < g.vecs ? g.load(v, key) : 0u;
    uint32_t eq = 0;
#pragma unroll
    for (int j = 0; j < I; ++j) {
      eq |= uint32_t(((m >> j) & 1u) && key[j] == tie) << j;
    }
    const uint32_t c = uint32_t(__popc(eq));
    uint32_t total;
    uint32_t e = run + radix::block_inclusive_scan(c, sh.scan[r & 1], total) - c;
#pragma unroll
    for (int j = 0; j < I; ++j) {
      if ((eq >> j) & 1u) {
        if (e < need && pos0 + e < k) {
          o.put(pos0 + e, g.col(v, j));
        }
        ++e;
      }
    }
    run += total;
  }
  __syncthreads();
}

// The exact fallback over the whole window, one CTA. Nothing of the row has been written.
template <typename T>
__device__ __forceinline__ void exact_row(const GlobalSrc<T>& g, uint32_t n, uint32_t k, uint32_t* keys,
                                          int32_t* cols, uint32_t* hist, Counters& cnt, const RowOut& o,
                                          SelectShared& sh) {
  SelectState st{0u, 0u, k, n};
  for (int level = 0; level < radix::kLevels; ++level) {
    radix::clear_hist(hist);
    __syncthreads();
    hist_pass(g, st, radix::level_shift(level), hist);
    __syncthreads();
    radix::refine(hist, level, st, sh);
    if (st.count == st.krem || st.count <= uint32_t(kCapacity)) {
      break;
    }
  }
  const bool take_bin = st.count == st.krem;
  const bool gather = !take_bin && st.count <= uint32_t(kCapacity);
  if (threadIdx.x == 0) {
    cnt.cand = 0u;
  }
  __syncthreads();
  gather_pass(g, st, gather, take_bin, keys, cols, cnt, o, k);
  __syncthreads();
  if (gather) {
    finish(keys, cols, int(st.count), st.krem, o, hist, cnt, k, sh);
  } else if (!take_bin) {  // more than kCapacity keys equal the k-th largest: the first ones win
    ordered_ties(g, st.prefix, st.krem, k - st.krem, o, k, sh);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 2) topk_filter_kernel(const __grid_constant__ KernelArgs a) {
  __shared__ SelectShared sh;
  __shared__ Counters cnt;
  extern __shared__ uint4 dyn_smem[];
  uint32_t* hist = reinterpret_cast<uint32_t*>(dyn_smem);
  uint32_t* keys = hist + radix::kBins;
  int32_t* cols = reinterpret_cast<int32_t*>(keys + kCapacity);

  pdl_wait();
  pdl_launch_dependents();

  const uint32_t csize = uint32_t(a.cluster);
  const int64_t r = blockIdx.x / csize;
  const uint32_t rank = csize > 1 ? radix::cluster_rank() : 0u;
  const Window w = row_window(a, r);
  const uint32_t n = uint32_t(w.hi - w.lo);
  const uint32_t k = uint32_t(a.k);
  const RowOut o = row_out(a, r, w.start);

  if (n <= k) {  // short window: its indices, then -1 (no shared memory of another CTA is touched)
    for (int64_t j = int64_t(rank) * blockDim.x + threadIdx.x; j < a.k; j += int64_t(csize) * blockDim.x) {
      if (j < n) {
        o.put(uint32_t(j), w.lo + j);
      } else {
        o.put_none(uint32_t(j));
      }
    }
    return;
  }

  const T* row = static_cast<const T*>(a.scores) + r * a.row_stride;
  if (threadIdx.x == 0) {
    cnt.cand = 0u;
    cnt.out = 0u;
    cnt.ok = 0u;
  }
  // The fast path needs the sampled 2k..4k keys to fit the buffer with room to spare.
  const bool fits = n <= uint32_t(kCapacity);
  const bool fast = fits || (a.sample != 0 && 4 * uint64_t(k) <= uint64_t(kCapacity));
  if (fast) {
    const uint32_t E = fits ? 0u : sample_threshold(row, w.lo, int64_t(n), 2 * k, keys, hist, sh);
    __syncthreads();  // the samples are dead; the counters are initialised
    const int64_t part = ((int64_t(n) + csize - 1) / csize + 15) & ~int64_t{15};
    const int64_t p_lo = w.lo + part * rank < w.hi ? w.lo + part * rank : w.hi;
    const int64_t p_hi = p_lo + part < w.hi ? p_lo + part : w.hi;
    GlobalSrc<T> g;
    g.init(row, p_lo, p_hi);
    filter_pass(g, E, keys, cols, cnt);
    if (csize > 1) {
      // Rank 0 gathers the other CTAs' candidates after its own, through distributed shared memory.
      radix::cluster_sync();
      if (rank == 0) {
        uint32_t total = 0;
        bool ok = true;
        for (uint32_t c = 0; c < csize; ++c) {
          const uint32_t m = radix::cluster_load(&cnt.cand, c);
          ok = ok && m <= uint32_t(kCapacity);
          total += m <= uint32_t(kCapacity) ? m : uint32_t(kCapacity) + 1u;
        }
        ok = ok && total >= k && total <= uint32_t(kCapacity);
        if (ok) {
          uint32_t at = radix::cluster_load(&cnt.cand, 0);
          for (uint32_t c = 1; c < csize; ++c) {
            const uint32_t m = radix::cluster_load(&cnt.cand, c);
            for (uint32_t i = threadIdx.x; i < m; i += blockDim.x) {
              keys[at + i] = radix::cluster_load(keys + i, c);
              cols[at + i] = int32_t(radix::cluster_load(reinterpret_cast<const uint32_t*>(cols + i), c));
            }
            at += m;
          }
        }
        __syncthreads();  // every thread read cnt.cand before thread 0 overwrites it
        if (threadIdx.x == 0) {
          cnt.cand = total;
          cnt.ok = ok ? 1u : 0u;
        }
      }
      radix::cluster_sync();  // no CTA leaves while rank 0 still reads its shared memory
      if (rank != 0) {
        return;
      }
    } else {
      __syncthreads();
      if (threadIdx.x == 0) {
        cnt.ok = cnt.cand >= k && cnt.cand <= uint32_t(kCapacity) ? 1u : 0u;
      }
    }
    __syncthreads();
    if (cnt.ok != 0u) {
      finish(keys, cols, int(cnt.cand), k, o, hist, cnt, k, sh);
      return;
    }
  } else if (rank != 0) {
    return;  // a split row without the fast path: rank 0 alone runs the exact fallback
  }
  GlobalSrc<T> g;
  g.init(row, w.lo, w.hi);
  exact_row(g, n, k, keys, cols, hist, cnt, o, sh);
}

using Kernel = void (*)(KernelArgs);

Kernel kernel_for(TopkDtype dtype) {
  switch (dtype) {
    case TopkDtype::kFloat32:
      return topk_filter_kernel<float>;
    case TopkDtype::kBFloat16:
      return topk_filter_kernel<__nv_bfloat16>;
    case TopkDtype::kFloat16:
      return topk_filter_kernel<__half>;
  }
  return nullptr;
}

// Allow the kernel kDynSmem bytes of dynamic shared memory on this device (once per device) and
// say whether a cluster of kMaxCluster CTAs can be scheduled.
cudaError_t prepare(Kernel kernel, int which, int device, bool* clusters) {
  static std::atomic<int> state[3][kMaxDevices] = {};  // 0 unknown, 1 clusters fit, 2 they do not
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached) {
    const int hit = state[which][device].load(std::memory_order_relaxed);
    if (hit != 0) {
      *clusters = hit == 1;
      return cudaSuccess;
    }
  }
  DSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kDynSmem));
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(topk_heuristics::kMaxCluster);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = size_t(kDynSmem);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = topk_heuristics::kMaxCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &config) != cudaSuccess) {
    (void)cudaGetLastError();  // a device or driver without clusters: one CTA per row
    n = 0;
  }
  *clusters = n >= 1;
  if (cached) {
    state[which][device].store(*clusters ? 1 : 2, std::memory_order_relaxed);
  }
  return cudaSuccess;
}

}  // namespace topk_filter_detail

cudaError_t launch_topk_filter(const TopkParams& p, cudaStream_t stream) {
  namespace d = topk_filter_detail;
  namespace h = topk_heuristics;
  const d::Kernel kernel = d::kernel_for(p.dtype);
  if (kernel == nullptr) {
    return cudaErrorInvalidValue;
  }
  topk_row::KernelArgs a = topk_row::make_args(p);
  int device = 0;
  int major = 0;
  int sms = 0;
  DSA_CUDA_CHECK(cudaGetDevice(&device));
  DSA_CUDA_CHECK(current_arch_major(&major));
  DSA_CUDA_CHECK(topk_row::device_attr<cudaDevAttrMultiProcessorCount>(device, &sms));
  bool clusters = false;
  DSA_CUDA_CHECK(d::prepare(kernel, int(p.dtype), device, &clusters));
  int cluster = major >= 9 && clusters ? h::filter_cluster_size(p.rows, p.width, p.k, sms) : 1;
  if (p.rows * cluster > INT32_MAX) {
    cluster = 1;
  }
  a.cluster = cluster;
  a.sample = h::filter_sampling() ? 1 : 0;

  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(p.rows * cluster));
  config.blockDim = dim3(unsigned(d::kThreads));
  config.dynamicSmemBytes = size_t(d::kDynSmem);
  config.stream = stream;
  cudaLaunchAttribute attrs[2];
  int n_attrs = 0;
  if (major >= 9) {  // programmatic dependent launch (the kernel waits before its first read)
    attrs[n_attrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n_attrs].val.programmaticStreamSerializationAllowed = 1;
    ++n_attrs;
  }
  if (cluster > 1) {
    attrs[n_attrs].id = cudaLaunchAttributeClusterDimension;
    attrs[n_attrs].val.clusterDim.x = unsigned(cluster);
    attrs[n_attrs].val.clusterDim.y = 1;
    attrs[n_attrs].val.clusterDim.z = 1;
    ++n_attrs;
  }
  config.attrs = attrs;
  config.numAttrs = unsigned(n_attrs);
  return cudaLaunchKernelEx(&config, kernel, a);
}

}  // namespace dsa_cuda
