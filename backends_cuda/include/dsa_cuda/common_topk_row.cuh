// Shared parts of the top-k kernels (kernels/topk.cu, kernels/topk_filter.cu): the kernel
// arguments, a row's window and output mapping, 16-byte loads of a window, and the warp-voted
// histogram pass. Torch-free, device code plus small host helpers.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "dsa_cuda/common_launch.cuh"
#include "dsa_cuda/common_radix_select.cuh"
#include "dsa_cuda/sm90_topk_heuristics.cuh"
#include "dsa_cuda/topk.cuh"

namespace dsa_cuda {
namespace topk_row {

using radix::SelectShared;
using radix::SelectState;

struct KernelArgs {
  const void* scores;
  int64_t width;
  int64_t row_stride;
  int32_t k;
  int32_t mode;
  const int32_t* lengths;
  int64_t lengths_stride;
  const int32_t* row_starts;
  int64_t row_starts_stride;
  int32_t* out;
  int64_t out_stride;
  int32_t* out_raw;
  int64_t out_raw_stride;
  const int32_t* page_table;
  int64_t batches;
  // min(max_pages, 2^32 - 1) and min(max_pages, 2^31) (the table's columns): RowOut::slot_limit for
  // rows whose table slots start at or above 0, and below it
  uint32_t slot_limit;
  uint32_t slot_limit_below;
  int64_t page_table_stride;
  const int32_t* row_to_batch;
  int64_t row_to_batch_stride;
  const int32_t* pt_row_starts;
  int64_t pt_row_starts_stride;
  const int32_t* offsets;
  int64_t offsets_stride;
  int32_t log2_page;
  // uint32 words of dynamic shared memory after the histogram(s) (a multiple of 4): a window (part)
  // of up to this many keys takes the list path; the stream path's candidates use half for keys,
  // half for indices.
  int32_t list_words;
  // List path only: uint32 words after the list (a multiple of 8, possibly 0) for the candidates
  // left after the first level (half keys, half indices).
  int32_t cand_words;
  // CTAs per row: 1, or the size of the thread-block cluster that splits each row (then the
  // dynamic shared memory holds a second histogram, the cluster's sum).
  int32_t cluster;
  // Rows read from device memory (one CTA per row) first try the sampled-threshold filter.
  int32_t sample;
  // Filter kernel: bytes of the head of its part of the window a CTA asks L2 for while it selects
  // the samples (0: none).
  int32_t prefetch_bytes;
  // The key of every NaN (radix::float_key): 0, below -inf, or 0xFFFFFFFF with nan_first.
  uint32_t nan_key;
};

// *p when `pred`, else `other`: one predicated load (a select of its address, or a branch around it,
// costs 3 to 6 instructions more; the page-table form's writes make one an output).
__device__ __forceinline__ int32_t ldg_if(bool pred, const int32_t* p, int32_t other) {
  int32_t v = other;
  asm("{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n @q ld.global.nc.b32 %0, [%1];\n}"
      : "+r"(v)
      : "l"(p), "r"(int32_t(pred)));
  return v;
}

// Where one row's results go, with the mapping of its mode.
struct RowOut {
  int32_t* out;
  int32_t* out_raw;
  int64_t start;
  int32_t mode;
  int32_t log2_page;
  const int32_t* table_row;
  // Index rel's table slot is first_slot + (rel >> log2_page) (first_slot: page_table_row_starts[r], an
  // int32, or 0), inside the table row when in [0, max_pages). In 32 bits: with rel >> log2_page in
  // [0, 2^31) the slot lies in [-2^31, 2^32 - 2], so its uint32 sum slot0 + (rel >> log2_page) is in the
  // table exactly when below slot_limit: min(max_pages, 2^32 - 1) for first_slot >= 0 (no wrap),
  // min(max_pages, 2^31) for first_slot < 0 (negative slots wrap to 2^31 and up); 0 when the row's
  // batch is outside the table (every index maps to -1). (64-bit slots cost ~5 instructions a lookup.)
  uint32_t slot0;
  uint32_t slot_limit;
  int64_t offset;

  __device__ __forceinline__ int32_t map(int32_t rel) const {
    if (mode == int32_t(TopkMode::kPlain)) {
      return rel;
    }
    if (rel < 0) {
      return -1;
    }
    if (mode == int32_t(TopkMode::kRagged)) {
      const int64_t s = int64_t(rel) + offset;
      return (s < 0 || s > int64_t(INT32_MAX)) ? -1 : int32_t(s);
    }
    const uint32_t slot = slot0 + uint32_t(rel >> log2_page);  // (page_of's, with a branch: fewer registers)
    return slot < slot_limit ? of_page(rel, __ldg(table_row + slot)) : -1;
  }
  // The page-table form in two steps, so that a caller can have several lookups in flight: page_of
  // issues the load of the page of `rel` (-1, no load, when rel < 0, its slot is outside the table or
  // `live` is false) and nothing waits on it there; of_page makes the index (-1 for a negative or too
  // large page).
  __device__ __forceinline__ int32_t page_of(int32_t rel, bool live = true) const {
    const uint32_t slot = slot0 + uint32_t(rel >> log2_page);
    return ldg_if(live && rel >= 0 && slot < slot_limit, table_row + slot, -1);
  }
  __device__ __forceinline__ int32_t of_page(int32_t rel, int32_t page) const {
    // page * P + rel % P fits int32 exactly when 0 <= page <= INT32_MAX / P (P = 2^log2_page <= 2^31):
    // one unsigned compare and 32-bit arithmetic, no 64-bit product to check.
    if (uint32_t(page) > (uint32_t(INT32_MAX) >> log2_page)) {
      return -1;
    }
    return int32_t((uint32_t(page) << log2_page) | (uint32_t(rel) & ((1u << log2_page) - 1u)));
  }

  // Output slot `pos` gets absolute column `col` (relative index col - start, wrapped to int32 as
  // the reference's cast does).
  __device__ __forceinline__ void put(uint32_t pos, int64_t col) const {
    const int32_t rel = int32_t(col - start);
    put_mapped(pos, rel, map(rel));
  }
  // Output slot `pos` gets relative index `rel`, already mapped (map(rel)): callers that write several
  // outputs map them all first, so their page-table loads overlap.
  __device__ __forceinline__ void put_mapped(uint32_t pos, int32_t rel, int32_t mapped) const {
    if (out_raw != nullptr) {
      out_raw[pos] = rel;
    }
    out[pos] = mapped;
  }
  __device__ __forceinline__ void put_none(uint32_t pos) const {
    if (out_raw != nullptr) {
      out_raw[pos] = -1;
    }
    out[pos] = -1;
  }
};

// The window [lo, hi) of one row in device memory, as 16-byte vectors: vector v covers columns
// [a0 + v * kItems, + kItems) with a0 <= lo the column of the 16-byte boundary at or before lo.
// Vectors wholly inside the window load with one 16-byte load; the (at most two) partial ones load
// their in-window elements one by one, so nothing outside the window is read.
template <typename T>
struct GlobalSrc {
  static constexpr int kItems = radix::KeyOf<T>::kItems;
  const T* row;
  int64_t lo;
  int64_t hi;
  int64_t a0;
  int32_t vecs;
  uint32_t nan_key;  // KernelArgs::nan_key

  __device__ __forceinline__ void init(const T* row_, int64_t lo_, int64_t hi_, uint32_t nan_key_) {
    row = row_;
    lo = lo_;
    hi = hi_;
    nan_key = nan_key_;
    a0 = lo - int64_t((reinterpret_cast<uintptr_t>(row + lo) & 15u) / sizeof(T));
    vecs = int32_t((hi - a0 + kItems - 1) / kItems);
  }
  // Keys of vector v (v < vecs); returns the mask of the items inside the window.
  __device__ __forceinline__ uint32_t load(int32_t v, uint32_t (&key)[kItems]) const {
    const int64_t i0 = a0 + int64_t(v) * kItems;
    if (i0 >= lo && i0 + kItems <= hi) {
      radix::KeyOf<T>::vec(__ldg(reinterpret_cast<const uint4*>(row + i0)), key, nan_key);
      return (1u << kItems) - 1u;
    }
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int64_t i = i0 + j;
      key[j] = 0u;
      if (i >= lo && i < hi) {
        key[j] = radix::KeyOf<T>::one(row + i, nan_key);
        m |= 1u << j;
      }
    }
    return m;
  }
  __device__ __forceinline__ int64_t col(int32_t v, int j) const { return a0 + int64_t(v) * kItems + j; }
};

// Keys in shared memory in index order: `count` keys, with their columns in `idx` (or, when idx is
// null, the columns lo, lo + 1, ...). The key array is readable up to count rounded up to 4.
struct ListSrc {
  static constexpr int kItems = 4;
  const uint32_t* keys;
  const int32_t* idx;
  int64_t lo;
  int32_t count;
  int32_t vecs;

  __device__ __forceinline__ ListSrc(const uint32_t* keys_, const int32_t* idx_, int64_t lo_, int32_t count_)
      : keys(keys_), idx(idx_), lo(lo_), count(count_), vecs((count_ + 3) / 4) {}
  __device__ __forceinline__ uint32_t load(int32_t v, uint32_t (&key)[4]) const {
    const uint4 x = *reinterpret_cast<const uint4*>(keys + 4 * v);
    key[0] = x.x;
    key[1] = x.y;
    key[2] = x.z;
    key[3] = x.w;
    const int32_t left = count - 4 * v;
    return left >= 4 ? 0xFu : (1u << left) - 1u;
  }
  __device__ __forceinline__ int64_t col(int32_t v, int j) const {
    return idx != nullptr ? int64_t(idx[4 * v + j]) : lo + 4 * int64_t(v) + j;
  }
};

// What a histogram pass records per bin beyond its count: nothing, or (BinOrAnd) the OR and the
// AND of the bin's keys, which agree when the bin holds a single value.
struct NoBinFold {
  struct Folded {};
  __device__ __forceinline__ Folded reduce(uint32_t, uint32_t) const { return {}; }
  __device__ __forceinline__ Folded one(uint32_t) const { return {}; }
  __device__ __forceinline__ void add(uint32_t, Folded) const {}
};
struct BinOrAnd {
  uint32_t* bin_or;
  uint32_t* bin_and;
  struct Folded {
    uint32_t o, a;
  };
  __device__ __forceinline__ Folded reduce(uint32_t group, uint32_t x) const {
    return {__reduce_or_sync(group, x), __reduce_and_sync(group, x)};
  }
  __device__ __forceinline__ Folded one(uint32_t x) const { return {x, x}; }
  __device__ __forceinline__ void add(uint32_t digit, Folded f) const {
    atomicOr(bin_or + digit, f.o);
    atomicAnd(bin_and + digit, f.a);
  }
};

// Count `digit` in the histogram for every lane with `take` (and fold its key x into the bin). The
// lanes that share the digit of the first taking lane add once, together (plateaus, all-equal rows
// and narrow ranges would otherwise serialise a warp on one bin); the others add one by one. The
// warp must be converged.
template <class Fold = NoBinFold>
__device__ __forceinline__ void hist_add(uint32_t* hist, bool take, uint32_t digit, uint32_t x = 0u,
                                         const Fold& fold = Fold()) {
  const uint32_t active = __ballot_sync(0xFFFFFFFFu, take);
  if (active == 0u) {
    return;
  }
  const int leader = __ffs(active) - 1;
  const uint32_t lead_digit = __shfl_sync(0xFFFFFFFFu, digit, leader);
  const bool with_leader = take && digit == lead_digit;
  const uint32_t group = __ballot_sync(0xFFFFFFFFu, with_leader);
  if (with_leader) {
    const auto folded = fold.reduce(group, x);
    if (int(threadIdx.x & 31) == leader) {
      atomicAdd(hist + lead_digit, uint32_t(__popc(group)));
      fold.add(lead_digit, folded);
    }
  } else if (take) {
    atomicAdd(hist + digit, 1u);
    fold.add(digit, fold.one(x));
  }
}

// Loop trip counts below are uniform over the block (bounds from per-row values only), so warps
// stay converged for the warp votes and every thread reaches every barrier.
template <class Src>
__device__ __forceinline__ int32_t vec_rounds(const Src& src, int per_round) {
  return (src.vecs + per_round - 1) / per_round;
}

// Round r of a pass over `src` with U 16-byte vectors per thread (vector u of this thread:
// r * U * blockDim.x + u * blockDim.x + threadIdx.x): their keys (0 outside the window) and masks.
template <int U, class Src>
__device__ __forceinline__ void load_round(const Src& src, int32_t r, uint32_t (&key)[U][Src::kItems],
                                           uint32_t (&m)[U]) {
  const int per_round = U * int(blockDim.x);
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int32_t v = r * per_round + u * int(blockDim.x) + int(threadIdx.x);
    m[u] = 0u;
#pragma unroll
    for (int j = 0; j < Src::kItems; ++j) {
      key[u][j] = 0u;
    }
    if (v < src.vecs) {
      m[u] = src.load(v, key[u]);
    }
  }
}

// One level's histogram over the candidates (keys equal to the prefix under the mask), U 16-byte
// vectors per thread per round (default: 16 keys, several loads in flight), with a per-bin fold.
template <class Src, class Fold = NoBinFold, int U = 16 / Src::kItems>
__device__ __forceinline__ void hist_pass(const Src& src, const SelectState& st, int shift, uint32_t* hist,
                                          const Fold& fold = Fold()) {
  constexpr int I = Src::kItems;
  const int per_round = U * int(blockDim.x);
  const int32_t rounds = vec_rounds(src, per_round);
  for (int32_t r = 0; r < rounds; ++r) {
    uint32_t key[U][I];
    uint32_t m[U];
    load_round<U>(src, r, key, m);
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int j = 0; j < I; ++j) {
        const uint32_t x = key[u][j];
        const bool take = ((m[u] >> j) & 1u) && (x & st.mask) == st.prefix;
        hist_add(hist, take, (x >> shift) & 0x7FFu, x, fold);
      }
    }
  }
}

__device__ __forceinline__ RowOut row_out(const KernelArgs& a, int64_t r, int64_t start) {
  RowOut o;
  o.out = a.out + r * a.out_stride;
  o.out_raw = a.out_raw != nullptr ? a.out_raw + r * a.out_raw_stride : nullptr;
  o.start = start;
  o.mode = a.mode;
  o.log2_page = a.log2_page;
  o.table_row = a.page_table;
  o.slot0 = 0;
  o.slot_limit = 0;
  o.offset = 0;
  if (a.mode == int32_t(TopkMode::kPageTable)) {
    const int64_t b = a.row_to_batch != nullptr ? int64_t(__ldg(a.row_to_batch + r * a.row_to_batch_stride)) : r;
    const bool ok = b >= 0 && b < a.batches;
    o.table_row = a.page_table + (ok ? b : 0) * a.page_table_stride;
    const int32_t first_slot = a.pt_row_starts != nullptr ? __ldg(a.pt_row_starts + r * a.pt_row_starts_stride) : 0;
    o.slot0 = uint32_t(first_slot);
    o.slot_limit = !ok ? 0u : first_slot < 0 ? a.slot_limit_below : a.slot_limit;
  } else if (a.mode == int32_t(TopkMode::kRagged)) {
    o.offset = int64_t(__ldg(a.offsets + r * a.offsets_stride));
  }
  return o;
}

// The window [lo, hi) of row r, clipped to [0, width): start = row_starts[r] (or 0), len =
// lengths[r] (or to the row end; negative means 0).
struct Window {
  int64_t start;
  int64_t lo;
  int64_t hi;
};

__device__ __forceinline__ Window row_window(const KernelArgs& a, int64_t r) {
  const int64_t width = a.width;
  const int64_t start = a.row_starts != nullptr ? int64_t(__ldg(a.row_starts + r * a.row_starts_stride)) : 0;
  int64_t len = a.lengths != nullptr ? int64_t(__ldg(a.lengths + r * a.lengths_stride)) : width - start;
  len = len < 0 ? 0 : len;
  const int64_t lo = start < 0 ? 0 : (start > width ? width : start);
  int64_t hi = start + len;
  hi = hi < lo ? lo : (hi > width ? width : hi);
  return Window{start, lo, hi};
}


// The kernel arguments of a launch, less the launch-shape fields (list_words, cand_words, cluster,
// sample), which each launcher sets.
inline KernelArgs make_args(const TopkParams& p) {
  KernelArgs a = {};
  a.scores = p.scores;
  a.width = p.width;
  a.row_stride = p.row_stride;
  a.k = int32_t(p.k);
  a.mode = int32_t(p.mode);
  a.lengths = p.lengths;
  a.lengths_stride = p.lengths_stride;
  a.row_starts = p.row_starts;
  a.row_starts_stride = p.row_starts_stride;
  a.out = p.out;
  a.out_stride = p.out_stride;
  a.out_raw = p.mode == TopkMode::kPageTable ? p.out_raw : nullptr;
  a.out_raw_stride = p.out_raw_stride;
  a.page_table = p.page_table;
  a.batches = p.batches;
  a.slot_limit = uint32_t(std::min<int64_t>(p.max_pages, UINT32_MAX));
  a.slot_limit_below = uint32_t(std::min<int64_t>(p.max_pages, int64_t(1) << 31));
  a.page_table_stride = p.page_table_stride;
  a.row_to_batch = p.row_to_batch;
  a.row_to_batch_stride = p.row_to_batch_stride;
  a.pt_row_starts = p.page_table_row_starts;
  a.pt_row_starts_stride = p.page_table_row_starts_stride;
  a.offsets = p.offsets;
  a.offsets_stride = p.offsets_stride;
  a.nan_key = p.nan_first ? 0xFFFFFFFFu : 0u;
  // page_size >= 2^31 behaves as 2^31: every valid index is in page slot 0, and only page 0 keeps
  // the slot id inside int32.
  int log2_page = 0;
  while (log2_page < 31 && (int64_t{1} << log2_page) < p.page_size) {
    ++log2_page;
  }
  a.log2_page = log2_page;
  return a;
}


using RowKernel = void (*)(KernelArgs);

// How many clusters of c CTAs of `kernel` (threads, smem bytes of dynamic shared memory each) the current
// device runs at once; 0 where a device or driver has no clusters.
inline int max_active_clusters(RowKernel kernel, int threads, int smem, int c) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(c));
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = size_t(smem);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(c);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    (void)cudaGetLastError();
    clusters = 0;
  }
  return clusters;
}

// Whether one cluster of kMaxCluster CTAs of `kernel` can be scheduled on the current device.
inline bool max_cluster_fits(RowKernel kernel, int threads, int smem) {
  return max_active_clusters(kernel, threads, smem, topk_heuristics::kMaxCluster) >= 1;
}

// active[c], c = 0..kMaxCluster: max_active_clusters for c CTAs (active[0] = 0, active[1]: CTAs).
inline void active_clusters(RowKernel kernel, int threads, int smem, int* active) {
  active[0] = 0;
  for (int c = 1; c <= topk_heuristics::kMaxCluster; ++c) {
    active[c] = max_active_clusters(kernel, threads, smem, c);
  }
}

}  // namespace topk_row

// The filter kernel's launcher (kernels/topk_filter.cu): launch_topk's path for deterministic=False.
cudaError_t launch_topk_filter(const TopkParams& p, cudaStream_t stream);
// Its narrow shape, one CTA a row (kernels/topk_filter_narrow.cu), which launch_topk_filter picks for
// the rows topk_heuristics::narrow_rows names where the device runs three or more of its CTAs an SM
// (topk_filter_narrow_fits: the occupancy, cached per device, and the kernel's shared-memory limit set;
// else the wide shape). The launch takes the arguments launch_topk_filter made and the device's SMs, and
// must follow a fits() that said yes on the current device.
bool topk_filter_narrow_fits(TopkDtype dtype, int device, int sms);
cudaError_t launch_topk_filter_narrow(const TopkParams& p, topk_row::KernelArgs a, int sms, cudaStream_t stream);

}  // namespace dsa_cuda
