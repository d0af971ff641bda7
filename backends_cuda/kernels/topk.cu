// Exact top-k of a window of each row: dsa.topk, dsa.topk_page_table_transform and
// dsa.topk_ragged_transform (include/dsa_cuda/topk.cuh). Torch-free: the compile gates build this
// file alone with nvcc.
//
// This is the ordered kernel, for deterministic=True; deterministic=False goes to the filter kernel
// (kernels/topk_filter.cu), which writes in any order.
//
// One CTA per row (rows on the flat grid.x). Every score becomes an order-preserving uint32 key
// (common_radix_select.cuh) and a radix select finds the k-th largest key T exactly, plus how many
// of the keys equal to T are taken (`need`, the tie rule takes the smallest indices). The output is
// written by an ordered compaction over the window in index order (a block scan per chunk), which
// takes every key > T and the first `need` keys == T: each output row is therefore ascending, and
// bitwise reproducible.
//
// Paths, per row, with n the window length:
//   n <= k      the window's indices 0..n-1 (relative), then -1.
//   n fits      ("list" path) the window is read once from device memory into shared memory as keys,
//               with the first level's histogram; the other levels and the write run from shared
//               memory. When the keys at or above the threshold bin of a level fit the candidate
//               area after the list (sized on the host so the CTAs per SM do not drop; usually after
//               the first level: k plus the bin's few hundred keys), one ordered pass copies them
//               with their columns and the remaining levels and the write run on those only.
//               Plateaus and heavy ties overflow it and keep every level over the whole list.
//   otherwise   ("stream" path) levels run over device memory. As soon as the keys that can still be
//               taken (those at or above the current bin) fit in shared memory, one more pass copies
//               them, in index order, with their indices, and the select finishes there. Otherwise
//               all three levels and the write read the row (4 reads): exact on any input.
#include "dsa_cuda/common_launch.cuh"
#include "dsa_cuda/common_radix_select.cuh"
#include "dsa_cuda/common_topk_row.cuh"
#include "dsa_cuda/sm90_topk_heuristics.cuh"
#include "dsa_cuda/topk.cuh"

#include <algorithm>
#include <atomic>

namespace dsa_cuda {
namespace topk_detail {

using namespace topk_row;  // KernelArgs, RowOut, GlobalSrc, ListSrc, hist_pass, row_window, ...

constexpr int kMaxThreads = 1024;
constexpr int kHistBytes = radix::kBins * 4;
// Shared memory kept free of the dynamic allocation for the static SelectShared and the runtime.
constexpr int kStaticReserve = 1024;
// The stream path's candidate buffer: at most this many (key, index) pairs, so two 1024-thread
// CTAs fit on an SM.
constexpr int kMaxCandidates = 12288;
// The list path's candidates after the first level: at most this many (key, index) pairs.
constexpr int kListCandidates = 8192;
// Single keys sampled from a long row to estimate its threshold.
constexpr int kSamples = 1024;


// The list path's first pass: the window's keys into shared memory (at column - lo) and the first
// level's histogram.
template <typename T>
__device__ __forceinline__ void fill_list(const GlobalSrc<T>& src, uint32_t* keys, uint32_t* hist) {
  constexpr int I = GlobalSrc<T>::kItems;
  constexpr int U = 16 / I;
  const int per_round = U * int(blockDim.x);
  const int32_t rounds = vec_rounds(src, per_round);
  const int32_t shift_cols = int32_t(src.lo - src.a0);
  for (int32_t r = 0; r < rounds; ++r) {
    uint32_t key[U][I];
    uint32_t m[U];
    load_round<U>(src, r, key, m);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int32_t v = r * per_round + u * int(blockDim.x) + int(threadIdx.x);
      if (m[u] == (1u << I) - 1u && (shift_cols & 3) == 0) {
        // A whole vector at a 16-byte boundary of the list: vector stores, no bank conflicts.
        uint4* dst = reinterpret_cast<uint4*>(keys + (v * I - shift_cols));
#pragma unroll
        for (int q = 0; q < I / 4; ++q) {
          dst[q] = make_uint4(key[u][4 * q], key[u][4 * q + 1], key[u][4 * q + 2], key[u][4 * q + 3]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < I; ++j) {
          if ((m[u] >> j) & 1u) {
            keys[v * I + j - shift_cols] = key[u][j];
          }
        }
      }
#pragma unroll
      for (int j = 0; j < I; ++j) {
        hist_add(hist, (m[u] >> j) & 1u, key[u][j] >> 21);
      }
    }
  }
}

// Ordered compaction over the source in index order: every key above the prefix (under the mask)
// and the first `need` keys equal to it go to sink.put(position, key, column). Positions count in
// index order from the keys before this source (run_gt above the prefix, run_eq equal to it: the
// other CTAs of a split row). Stops once `target` keys are placed; returns the count placed
// (including the keys before). Ends with a barrier.
template <class Src, class Sink>
__device__ __forceinline__ uint32_t ordered_select(const Src& src, const SelectState& st, uint32_t need,
                                                   uint32_t target, const Sink& sink, SelectShared& sh,
                                                   uint32_t run_gt = 0, uint32_t run_eq = 0) {
  constexpr int I = Src::kItems;
  // Per chunk at most 1024 * 8 keys: both counts fit in 16 bits of one packed word.
  const int32_t rounds = run_gt + min(run_eq, need) >= target ? 0 : vec_rounds(src, int(blockDim.x));
  for (int32_t r = 0; r < rounds; ++r) {
    const int32_t v = r * int(blockDim.x) + int(threadIdx.x);
    uint32_t key[I] = {};
    const uint32_t m = v < src.vecs ? src.load(v, key) : 0u;
    uint32_t gt = 0;
    uint32_t eq = 0;
#pragma unroll
    for (int j = 0; j < I; ++j) {
      if ((m >> j) & 1u) {
        const uint32_t mk = key[j] & st.mask;
        gt |= uint32_t(mk > st.prefix) << j;
        eq |= uint32_t(mk == st.prefix) << j;
      }
    }
    const uint32_t packed = (uint32_t(__popc(gt)) << 16) | uint32_t(__popc(eq));
    uint32_t total;
    const uint32_t excl = radix::block_inclusive_scan(packed, sh.scan[r & 1], total) - packed;
    uint32_t gb = run_gt + (excl >> 16);
    uint32_t eb = run_eq + (excl & 0xFFFFu);
    if (gt | eq) {
#pragma unroll
      for (int j = 0; j < I; ++j) {
        if ((gt >> j) & 1u) {
          sink.put(gb + min(eb, need), key[j], src.col(v, j));
          ++gb;
        } else if ((eq >> j) & 1u) {
          if (eb < need) {
            sink.put(gb + eb, key[j], src.col(v, j));
          }
          ++eb;
        }
      }
    }
    run_gt += total >> 16;
    run_eq += total & 0xFFFFu;
    if (run_gt + min(run_eq, need) >= target) {
      break;
    }
  }
  __syncthreads();
  return run_gt + min(run_eq, need);  // keys placed (all of them when the source ran to its end)
}

struct OutSink {
  const RowOut& o;
  __device__ __forceinline__ void put(uint32_t pos, uint32_t, int64_t col) const { o.put(pos, col); }
};

struct ListSink {
  uint32_t* keys;
  int32_t* idx;
  uint32_t cap;  // positions at or past it are counted by the caller but not stored
  __device__ __forceinline__ void put(uint32_t pos, uint32_t key, int64_t col) const {
    if (pos < cap) {
      keys[pos] = key;
      idx[pos] = int32_t(col);
    }
  }
};

// The sampled-threshold filter of a long row (one CTA per row): the key E such that about
// `want` keys of the part are >= E, estimated from kSamples evenly spaced single keys (the
// j-th largest sample), then one ordered pass over device memory copies every key >= E with its
// column into the candidate buffer. Returns how many keys are >= E (all stored when <= cap). The
// caller finishes exactly on the candidates when k <= count <= cap (they then hold the top k) and
// rescans the part otherwise.
template <typename T>
__device__ __forceinline__ uint32_t sample_filter(const GlobalSrc<T>& g, uint32_t want, uint32_t* cand_keys,
                                                  int32_t* cand_idx, uint32_t cap, uint32_t* hist,
                                                  SelectShared& sh) {
  const int64_t pn = g.hi - g.lo;  // > kSamples
  for (int i = threadIdx.x; i < kSamples; i += blockDim.x) {
    const int64_t pos = g.lo + (int64_t(i) * pn + pn / 2) / kSamples;
    cand_keys[i] = radix::KeyOf<T>::one(g.row + pos, g.nan_key);
  }
  const ListSrc samples(cand_keys, nullptr, 0, kSamples);
  uint64_t j = (uint64_t(kSamples) * want) / uint64_t(pn);
  j = j < 1 ? 1 : (j > uint64_t(kSamples) ? uint64_t(kSamples) : j);
  SelectState ss{0u, 0u, uint32_t(j), uint32_t(kSamples)};
  for (int level = 0; level < radix::kLevels && ss.count != ss.krem; ++level) {
    radix::clear_hist(hist);
    __syncthreads();  // (the first one also publishes the samples)
    hist_pass(samples, ss, radix::level_shift(level), hist);
    __syncthreads();
    radix::refine(hist, level, ss, sh);  // ends with a barrier: the samples are dead after it
  }
  // Keys >= E: above E, or equal to it, under the full mask.
  const SelectState filter{ss.prefix, 0xFFFFFFFFu, 0u, 0u};
  return ordered_select(g, filter, 0xFFFFFFFFu, 0xFFFFFFFFu, ListSink{cand_keys, cand_idx, cap}, sh);
}

// After a level's histogram is complete in `hist` (and a barrier): narrow the select to the bin of
// the krem-th largest candidate. A split row (csize > 1 CTAs in a cluster) first sums the CTAs'
// histograms into `total` through distributed shared memory, so every CTA takes the same decision.
// `part_gt` / `part_eq` follow this CTA's own keys above / equal to the prefix. Ends with a barrier
// after which `hist` may be cleared.
__device__ __forceinline__ void level_refine(const uint32_t* hist, uint32_t* total, int level, SelectState& st,
                                             uint32_t& part_gt, uint32_t& part_eq, uint32_t csize,
                                             SelectShared& sh) {
  if (csize == 1) {
    radix::refine(hist, level, st, sh);
    part_gt += sh.above;
    part_eq = sh.count;
    return;
  }
  radix::cluster_sync();  // every CTA's histogram of this level is complete
  for (int b = threadIdx.x; b < radix::kBins; b += blockDim.x) {
    uint32_t sum = 0;
    for (uint32_t c = 0; c < csize; ++c) {
      sum += radix::cluster_load(hist + b, c);
    }
    total[b] = sum;
  }
  __syncthreads();
  radix::refine(total, level, st, sh);
  // This CTA's keys in the bins above the chosen one, and in it.
  const uint32_t bin = sh.bin;
  const int per = radix::kBins / blockDim.x;
  const int first = threadIdx.x * per;
  uint32_t above = 0;
  for (int b = 0; b < per; ++b) {
    above += uint32_t(first + b) > bin ? hist[first + b] : 0u;
  }
  uint32_t above_all;
  radix::block_inclusive_scan(above, sh.scan[1], above_all);
  part_gt += above_all;
  part_eq = hist[bin];
  radix::cluster_sync();  // no CTA clears its histogram while another still reads it
}


// One row per CTA, or per cluster of a.cluster CTAs (each takes a contiguous part of the window).
template <typename T>
__global__ void __launch_bounds__(kMaxThreads) topk_kernel(const __grid_constant__ KernelArgs a) {
  __shared__ SelectShared sh;
  extern __shared__ uint4 dyn_smem[];
  const uint32_t csize = uint32_t(a.cluster);
  uint32_t* hist = reinterpret_cast<uint32_t*>(dyn_smem);
  uint32_t* total = csize > 1 ? hist + radix::kBins : hist;  // merged histogram of a split row
  uint32_t* list = total + radix::kBins;

  pdl_wait();
  // No early pdl_launch_dependents (topk_filter.cu says why).

  const int64_t r = blockIdx.x / csize;
  const uint32_t rank = csize > 1 ? radix::cluster_rank() : 0u;
  const Window w = row_window(a, r);
  const int64_t start = w.start;
  const int64_t lo = w.lo;
  const int64_t hi = w.hi;
  const int32_t n = int32_t(hi - lo);  // width < 2^31

  if (n <= a.k) {  // short window: its indices, then -1 (no shared memory of another CTA is touched)
    const RowOut o = row_out(a, r, start);
    for (int64_t j = int64_t(rank) * blockDim.x + threadIdx.x; j < a.k; j += int64_t(csize) * blockDim.x) {
      if (j < n) {
        o.put(uint32_t(j), lo + j);
      } else {
        o.put_none(uint32_t(j));
      }
    }
    return;
  }

  // This CTA's part [p_lo, p_hi) of the window: parts of a multiple of 16 keys, in rank order.
  const int64_t part = ((int64_t(n) + csize - 1) / csize + 15) & ~int64_t{15};
  const int64_t p_lo = lo + part * rank < hi ? lo + part * rank : hi;
  const int64_t p_hi = p_lo + part < hi ? p_lo + part : hi;
  const int32_t pn = int32_t(p_hi - p_lo);

  const uint32_t k = uint32_t(a.k);
  GlobalSrc<T> g;
  g.init(static_cast<const T*>(a.scores) + r * a.row_stride, p_lo, p_hi, a.nan_key);
  SelectState st{0u, 0u, k, uint32_t(n)};
  uint32_t part_gt = 0;  // this CTA's keys above the prefix (all taken)
  uint32_t part_eq = 0;  // this CTA's keys equal to the prefix (candidates)
  // The keys still in play live in device memory (g) until they fit in shared memory (list).
  bool in_list = pn <= a.list_words;
  ListSrc lst(list, nullptr, p_lo, pn);  // list path: the part's keys at column - p_lo
  const int32_t cap = (a.list_words / 2) & ~3;  // stream path: candidate keys, then their columns
  uint32_t* cand_keys = list;
  int32_t* cand_idx = reinterpret_cast<int32_t*>(list + cap);
  // Where the keys at or above the bin go once they fit (compaction, at most once): the stream path
  // reuses the list area; the list path has its own area after the list (ccap 0: none).
  const int32_t ccap = in_list ? (a.cand_words / 2) & ~3 : cap;
  uint32_t* comp_keys = in_list ? list + a.list_words : cand_keys;
  int32_t* comp_idx = reinterpret_cast<int32_t*>(comp_keys + ccap);

  bool from_global = !in_list;
  bool compacted = false;  // the keys in play are a compacted candidate list (lst.idx != nullptr)
  if (!in_list && a.sample != 0 && csize == 1 && 2 * k <= uint32_t(cap) && pn > kSamples) {
    // One read instead of two or more, when the sampled threshold leaves between k and cap keys.
    const uint32_t want = min(uint32_t(cap) / 2, 3 * k);
    const uint32_t count = sample_filter(g, want, cand_keys, cand_idx, uint32_t(cap), hist, sh);
    if (count >= k && count <= uint32_t(cap)) {
      lst = ListSrc(cand_keys, cand_idx, p_lo, int32_t(count));
      in_list = true;
      from_global = false;
      compacted = true;
    }
  }
  radix::clear_hist(hist);
  __syncthreads();
  if (!from_global && lst.idx == nullptr) {
    fill_list(g, list, hist);  // the only read of the part from device memory
  } else if (in_list) {
    hist_pass(lst, st, radix::level_shift(0), hist);  // the sampled candidates
  } else {
    hist_pass(g, st, radix::level_shift(0), hist);
  }
  __syncthreads();
  for (int level = 0;; ++level) {
    level_refine(hist, total, level, st, part_gt, part_eq, csize, sh);
    if (st.count == st.krem || level + 1 == radix::kLevels) {
      break;  // every candidate left is taken, or the k-th key is known exactly
    }
    if (!compacted && ccap > 0 && part_gt + part_eq <= uint32_t(ccap)) {
      // This CTA's keys at or above the bin fit: copy them, in index order, with their columns, and
      // run the remaining levels and the write on them only (from the list or device memory).
      const ListSink sink{comp_keys, comp_idx, uint32_t(ccap)};
      if (in_list) {
        ordered_select(lst, st, 0xFFFFFFFFu, part_gt + part_eq, sink, sh);
      } else {
        ordered_select(g, st, 0xFFFFFFFFu, part_gt + part_eq, sink, sh);
      }
      lst = ListSrc(comp_keys, comp_idx, p_lo, int32_t(part_gt + part_eq));
      in_list = true;
      compacted = true;
    }
    radix::clear_hist(hist);
    __syncthreads();
    if (in_list) {
      hist_pass(lst, st, radix::level_shift(level + 1), hist);
    } else {
      hist_pass(g, st, radix::level_shift(level + 1), hist);
    }
    __syncthreads();
  }

  // The keys before this CTA's part: the parts of the lower ranks.
  uint32_t base_gt = 0;
  uint32_t base_eq = 0;
  if (csize > 1) {
    if (threadIdx.x == 0) {
      sh.part_gt = part_gt;
      sh.part_eq = part_eq;
    }
    radix::cluster_sync();
    for (uint32_t c = 0; c < rank; ++c) {
      base_gt += radix::cluster_load(&sh.part_gt, c);
      base_eq += radix::cluster_load(&sh.part_eq, c);
    }
    radix::cluster_sync();  // no CTA leaves while another still reads its shared memory
  }
  const RowOut o = row_out(a, r, start);  // built late: fewer registers live during the select
  if (in_list) {
    ordered_select(lst, st, st.krem, k, OutSink{o}, sh, base_gt, base_eq);
  } else {
    ordered_select(g, st, st.krem, k, OutSink{o}, sh, base_gt, base_eq);
  }
}

using Kernel = void (*)(KernelArgs);

Kernel kernel_for(TopkDtype dtype) {
  switch (dtype) {
    case TopkDtype::kFloat32:
      return topk_kernel<float>;
    case TopkDtype::kBFloat16:
      return topk_kernel<__nv_bfloat16>;
    case TopkDtype::kFloat16:
      return topk_kernel<__half>;
  }
  return nullptr;
}


// Allow the kernel `max_dyn` bytes of dynamic shared memory on this device (once per device).
cudaError_t allow_smem(Kernel kernel, int which, int device, int max_dyn) {
  static std::atomic<int> done[3][kMaxDevices] = {};
  if (device >= 0 && device < kMaxDevices && done[which][device].load(std::memory_order_relaxed) == max_dyn) {
    return cudaSuccess;
  }
  DSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_dyn));
  if (device >= 0 && device < kMaxDevices) {
    done[which][device].store(max_dyn, std::memory_order_relaxed);
  }
  return cudaSuccess;
}

// Whether the largest cluster we launch (kMaxCluster CTAs of 1024 threads with all the shared
// memory) can be scheduled on this device: asked once per device and kernel.
cudaError_t clusters_fit(Kernel kernel, int which, int device, int max_dyn, bool* fit) {
  static std::atomic<int> cache[3][kMaxDevices] = {};  // 0 unknown, 1 yes, 2 no
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached) {
    const int hit = cache[which][device].load(std::memory_order_relaxed);
    if (hit != 0) {
      *fit = hit == 1;
      return cudaSuccess;
    }
  }
  *fit = max_cluster_fits(kernel, kMaxThreads, max_dyn);
  if (cached) {
    cache[which][device].store(*fit ? 1 : 2, std::memory_order_relaxed);
  }
  return cudaSuccess;
}

}  // namespace topk_detail

cudaError_t launch_topk(const TopkParams& p, cudaStream_t stream) {
  namespace d = topk_detail;
  namespace h = topk_heuristics;
  if (p.rows <= 0 || p.k <= 0) {
    return cudaSuccess;
  }
  if (p.rows > INT32_MAX || p.k > INT32_MAX || p.width < 0 || p.width > INT32_MAX - 16) {
    return cudaErrorInvalidValue;
  }
  if (p.mode == TopkMode::kRagged && p.offsets == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (!p.deterministic) {
    return launch_topk_filter(p, stream);
  }
  const d::Kernel kernel = d::kernel_for(p.dtype);
  if (kernel == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int which = int(p.dtype);

  d::KernelArgs a = topk_row::make_args(p);

  int device = 0;
  DSA_CUDA_CHECK(cudaGetDevice(&device));
  int major = 0;
  int optin = 0;
  int per_sm = 0;
  int sms = 0;
  DSA_CUDA_CHECK(device_attr<cudaDevAttrComputeCapabilityMajor>(device, &major));
  DSA_CUDA_CHECK(device_attr<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device, &optin));
  DSA_CUDA_CHECK(device_attr<cudaDevAttrMaxSharedMemoryPerMultiprocessor>(device, &per_sm));
  DSA_CUDA_CHECK(device_attr<cudaDevAttrMultiProcessorCount>(device, &sms));
  const int max_dyn = optin - d::kStaticReserve;
  DSA_CUDA_CHECK(d::allow_smem(kernel, which, device, max_dyn));

  int cluster = major >= 9 ? h::cluster_size(p.rows, p.width, p.k, sms) : 1;
  if (cluster > 1) {
    bool fit = false;
    DSA_CUDA_CHECK(d::clusters_fit(kernel, which, device, max_dyn, &fit));
    cluster = fit ? cluster : 1;
  }
  if (p.rows * cluster > INT32_MAX) {
    cluster = 1;
  }
  a.cluster = cluster;
  a.sample = h::sampled_filter(cluster) ? 1 : 0;

  // Shared memory: the histogram (two for a split row), then the list: a part that fits takes the
  // list path; otherwise the stream path's candidate buffer.
  const int hist_bytes = d::kHistBytes * (cluster > 1 ? 2 : 1);
  const int64_t max_words = int64_t((max_dyn - hist_bytes) / 4) & ~int64_t{3};
  const int64_t part = ((p.width + cluster - 1) / cluster + 15) & ~int64_t{15};
  const int64_t part4 = (part + 3) & ~int64_t{3};
  const int64_t list_words = part4 <= max_words ? part4 : std::min<int64_t>(max_words, 2 * d::kMaxCandidates);
  a.list_words = int32_t(list_words);
  const int smem0 = hist_bytes + int(list_words) * 4;
  const int per_cta_extra = int(sizeof(radix::SelectShared)) + d::kStaticReserve;
  const int ctas_by_smem = per_sm / (smem0 + per_cta_extra);
  const int threads = h::threads(p.width, cluster, ctas_by_smem);
  // List path: room for the candidates compacted after the first level, taken from what the CTAs
  // resident on an SM (by shared memory and by threads) leave free, so occupancy does not drop.
  int64_t cand_words = 0;
  if (part4 <= max_words && ctas_by_smem >= 1) {
    int resident = std::min(ctas_by_smem, std::max(1, 2048 / threads));
    resident = std::min(resident, 32);
    const int64_t by_sm = int64_t(per_sm / resident - per_cta_extra - smem0) / 4;
    const int64_t by_cta = int64_t(max_dyn - smem0) / 4;
    cand_words = std::min<int64_t>({by_sm, by_cta, 2 * int64_t(d::kListCandidates)});
    cand_words = cand_words < 16 ? 0 : (cand_words & ~int64_t{7});
  }
  a.cand_words = int32_t(cand_words);
  const int smem = smem0 + int(cand_words) * 4;

  // Rows on the flat grid.x, `cluster` CTAs each.
  return launch_pdl_clustered(kernel, dim3(unsigned(p.rows * cluster)), dim3(unsigned(threads)), size_t(smem), stream,
                              cluster, a);
}

}  // namespace dsa_cuda
