// dsa.topk, dsa.topk_page_table_transform and dsa.topk_ragged_transform, native HIP for gfx950
// (wave64). Through dsa_hip/hip_compat.h the same source builds with nvcc (warp 32) for the H200
// correctness run. Contract: include/dsa_hip/topk.h.
//
// Keys: every score becomes a uint32 whose unsigned order is the ranking order: larger score ->
// larger key, -0.0 and +0.0 -> one key, every NaN -> nan_key: 0 (below -inf), or 0xFFFFFFFF (above
// +inf) with nan_first, a runtime value (KernelArgs::nan_key). bf16 and fp16 go through their
// exact fp32 value. An exact radix select over the key finds the k-th largest key T in three levels
// (12-bit histograms of bits 31..20 and 19..8 in LDS, then bits 7..0): after each level the keys are
// split into those above the threshold bin (all taken), the bin's keys (candidates) and the rest.
// A level whose bin's keys are all taken ends the select early. The select's state is (prefix,
// mask, need): keys with (key & mask) > prefix are taken, and of the keys with (key & mask) ==
// prefix the `need` with the smallest indices (the tie rule).
//
// One workgroup per row (split == 1): level 0 reads the window; when the threshold bin holds at most
// kTieCap keys, one more read copies them into an LDS tie buffer and levels 1 and 2 run there;
// otherwise (plateaus, heavy ties) levels 1 and 2 rescan the window. Exact always.
// Row split (split > 1, few long rows): `split` workgroups per row, each on a part of the window, in
// a sequence of kernels meeting in a device workspace: per level, partial histograms, then one
// workgroup per row merges them and advances the select state; then per part counts of taken keys,
// and the write.
//
// The write is an ordered compaction over the window in index order (a workgroup scan per tile of
// kThreads * kItems keys): every output row is ascending, bitwise reproducible. Rows are on a flat
// grid (grid-stride past kMaxBlocks). Nothing outside the window, the tables or the output is read
// or written.
#include "dsa_hip/topk.h"

namespace dsa_hip {
namespace topk_detail {

constexpr int kThreads = 1024;
constexpr int kBins = kTopkBins;
constexpr int kBinsPerThread = kBins / kThreads;
constexpr int kItems = 4;         // consecutive keys per thread in a tile of the ordered write
constexpr int kTieCap = 6144;     // LDS tie buffer, in keys
constexpr uint32_t kMaxBlocks = 1u << 20;
static_assert(kBins % kThreads == 0, "each thread owns whole bins");

struct KernelArgs {
  const void* scores;
  int64_t rows;
  int64_t width;
  int64_t row_stride;
  int64_t k;
  const int32_t* lengths;
  int64_t lengths_stride;
  const int32_t* row_starts;
  int64_t row_starts_stride;
  int32_t* out;
  int64_t out_stride;
  int32_t* out_raw;
  int64_t out_raw_stride;
  int32_t mode;
  int32_t log2_page;
  const int32_t* page_table;
  int64_t batches;
  int64_t max_pages;
  int64_t page_table_stride;
  const int32_t* row_to_batch;
  int64_t row_to_batch_stride;
  const int32_t* pt_row_starts;
  int64_t pt_row_starts_stride;
  const int32_t* offsets;
  int64_t offsets_stride;
  uint32_t nan_key;  // the key of every NaN: 0, or 0xFFFFFFFF with nan_first
  uint32_t grid;   // blocks launched (the grid-stride step)
  int32_t split;   // parts per row
  uint32_t* ws_hist;   // [rows * split][kBins]
  uint32_t* ws_cnt;    // [rows * split][2]: keys taken above the threshold, keys equal to it
  uint32_t* ws_state;  // [rows][8]: prefix, mask, need, count, done
};

// ---------------------------------------------------------------------------------------------
// Keys

__device__ __forceinline__ uint32_t key_of_bits(uint32_t b, uint32_t nan_key) {
  const uint32_t m = b & 0x7FFFFFFFu;
  if (m > 0x7F800000u) {
    return nan_key;  // NaN
  }
  if (m == 0u) {
    b = 0u;  // -0.0 -> +0.0
  }
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Exact fp16 -> fp32 bits.
__device__ __forceinline__ uint32_t fp16_to_f32_bits(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x3FFu;
  if (e == 0x1Fu) {
    return sign | 0x7F800000u | (m << 13);
  }
  if (e != 0u) {
    return sign | ((e + 112u) << 23) | (m << 13);
  }
  return sign | float_bits(float(m) * 5.9604644775390625e-8f);  // m * 2^-24, exact (0 for m == 0)
}

// kDtype: TopkDtype as int.
template <int kDtype>
__device__ __forceinline__ uint32_t load_key(const void* row, int64_t i, uint32_t nan_key) {
  if (kDtype == 0) {
    return key_of_bits(static_cast<const uint32_t*>(row)[i], nan_key);
  }
  const uint32_t h = static_cast<const uint16_t*>(row)[i];
  return key_of_bits(kDtype == 1 ? (h << 16) : fp16_to_f32_bits(h), nan_key);
}

__device__ __forceinline__ int level_shift(int level) { return level == 0 ? 20 : (level == 1 ? 8 : 0); }
__device__ __forceinline__ uint32_t level_mask(int level) {
  return level == 0 ? 0xFFF00000u : (level == 1 ? 0xFFFFFF00u : 0xFFFFFFFFu);
}
__device__ __forceinline__ uint32_t digit(uint32_t key, int level) {
  return (key >> level_shift(level)) & (level == 2 ? 0xFFu : 0xFFFu);
}

// ---------------------------------------------------------------------------------------------
// Rows

struct Window {
  int64_t start;  // relative indices count from here
  int64_t lo;
  int64_t hi;
};

__device__ __forceinline__ Window window_of(const KernelArgs& a, int64_t row) {
  Window w;
  w.start = a.row_starts != nullptr ? int64_t{a.row_starts[row * a.row_starts_stride]} : 0;
  int64_t len = a.lengths != nullptr ? int64_t{a.lengths[row * a.lengths_stride]} : a.width - w.start;
  len = len < 0 ? 0 : len;
  const int64_t end = w.start + len;
  w.lo = w.start < 0 ? 0 : (w.start > a.width ? a.width : w.start);
  w.hi = end < 0 ? 0 : (end > a.width ? a.width : end);
  w.hi = w.hi < w.lo ? w.lo : w.hi;
  return w;
}

// Where one row's results go, with the mapping of its mode.
struct RowOut {
  int32_t* out;
  int32_t* out_raw;
  int64_t start;
  int32_t mode;
  int32_t log2_page;
  const int32_t* table_row;
  int64_t first_slot;
  int64_t slots;  // 0 when the row's batch is outside the table: every index maps to -1
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
    const int64_t slot = first_slot + (rel >> log2_page);
    if (uint64_t(slot) >= uint64_t(slots)) {  // unsigned: a negative slot fails too
      return -1;
    }
    const int32_t page = table_row[slot];
    if (page < 0) {
      return -1;
    }
    const int64_t phys = (int64_t(page) << log2_page) + int64_t(uint32_t(rel) & ((1u << log2_page) - 1u));
    return phys > int64_t(INT32_MAX) ? -1 : int32_t(phys);
  }
  // Output slot `pos` gets column `col` (relative index col - start, wrapped to int32 as the
  // reference's cast does).
  __device__ __forceinline__ void put(int64_t pos, int64_t col) const {
    const int32_t rel = int32_t(uint32_t(uint64_t(col - start)));
    if (out_raw != nullptr) {
      out_raw[pos] = rel;
    }
    out[pos] = map(rel);
  }
  __device__ __forceinline__ void put_none(int64_t pos) const {
    if (out_raw != nullptr) {
      out_raw[pos] = -1;
    }
    out[pos] = -1;
  }
};

__device__ __forceinline__ RowOut row_out(const KernelArgs& a, int64_t row, int64_t start) {
  RowOut o;
  o.out = a.out + row * a.out_stride;
  o.out_raw = a.out_raw != nullptr ? a.out_raw + row * a.out_raw_stride : nullptr;
  o.start = start;
  o.mode = a.mode;
  o.log2_page = a.log2_page;
  o.table_row = a.page_table;
  o.first_slot = 0;
  o.slots = 0;
  o.offset = 0;
  if (a.mode == int32_t(TopkMode::kPageTable)) {
    const int64_t b = a.row_to_batch != nullptr ? int64_t{a.row_to_batch[row * a.row_to_batch_stride]} : row;
    const bool ok = b >= 0 && b < a.batches;
    o.table_row = a.page_table + (ok ? b : 0) * a.page_table_stride;
    o.slots = ok ? a.max_pages : 0;
    o.first_slot = a.pt_row_starts != nullptr ? int64_t{a.pt_row_starts[row * a.pt_row_starts_stride]} : 0;
  } else if (a.mode == int32_t(TopkMode::kRagged)) {
    o.offset = a.offsets[row * a.offsets_stride];
  }
  return o;
}

// A window of n <= k keys: 0..n-1, then -1.
__device__ __forceinline__ void write_short(const RowOut& o, const Window& w, int64_t k) {
  const int64_t n = w.hi - w.lo;
  for (int64_t j = thread_id_x(); j < k; j += kThreads) {
    if (j < n) {
      o.put(j, w.lo + j);
    } else {
      o.put_none(j);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Workgroup building blocks

struct Shared {
  uint32_t hist[kBins];
  uint32_t wave_sums[kThreads / 32];
  uint32_t bin;
  uint32_t above;
  uint32_t count;
  uint32_t nbuf;
  uint32_t tie[kTieCap];
};

// Inclusive prefix sum over the first `width` lanes of the wave (a power of two, at most the wave):
// lane i gets the sum of lanes max(0, i - width + 1)..i, so lanes below `width` get their exact
// prefix. Every lane of the wave must call it.
template <int kWarpSize>
__device__ __forceinline__ uint32_t wave_inclusive_scan(uint32_t v, uint32_t lane, int width) {
#pragma unroll
  for (uint32_t d = 1; d < uint32_t(kWarpSize); d <<= 1) {
    if (d < uint32_t(width)) {
      const uint32_t t = wave_shfl_up(v, d, lane);
      if (lane >= d) {
        v += t;
      }
    }
  }
  return v;
}

// Exclusive prefix sum over the workgroup in thread order; `total` gets the sum. Two barriers.
// Both levels are wave scans by shuffles: the wave totals go through LDS and every wave scans them
// again in its low lanes. (Summing the totals with a compare per wave made the compiler keep one
// 64-bit lane mask per wave in SGPRs across the kernels' loops: SGPR spills on gfx950.)
template <int kWarpSize>
__device__ __forceinline__ uint32_t block_exclusive_scan(uint32_t v, uint32_t* wave_sums, uint32_t& total) {
  constexpr int kWaves = kThreads / kWarpSize;
  static_assert(kWaves <= kWarpSize && (kWaves & (kWaves - 1)) == 0, "one wave scans the wave totals");
  const uint32_t tid = thread_id_x();
  const uint32_t lane = tid & uint32_t(kWarpSize - 1);
  const uint32_t wave = tid / uint32_t(kWarpSize);
  const uint32_t incl = wave_inclusive_scan<kWarpSize>(v, lane, kWarpSize);
  if (lane == uint32_t(kWarpSize - 1)) {
    wave_sums[wave] = incl;
  }
  block_sync();
  // Lane i < kWaves: inclusive sum of the totals of waves 0..i (lanes past kWaves: unused).
  const uint32_t x = wave_sums[lane & uint32_t(kWaves - 1)];
  const uint32_t wincl = wave_inclusive_scan<kWarpSize>(x, lane, kWaves);
  const uint32_t before = wave_read_lane(wincl - x, wave);
  total = wave_read_lane(wincl, uint32_t(kWaves - 1));
  block_sync();
  return before + incl - v;
}

struct Select {
  uint32_t prefix;
  uint32_t mask;
  uint32_t need;   // candidates (keys with (key & mask) == prefix) still to take, >= 1
  uint32_t count;  // candidates
  uint32_t done;   // need is final: the write takes (key & mask) > prefix and `need` of the rest
};

__device__ __forceinline__ Select select_init(int64_t k) {
  Select s;
  s.prefix = 0u;
  s.mask = 0u;
  s.need = uint32_t(k);
  s.count = 0u;
  s.done = 0u;
  return s;
}

__device__ __forceinline__ void clear_hist(Shared& sh) {
  for (int b = int(thread_id_x()); b < kBins; b += kThreads) {
    sh.hist[b] = 0u;
  }
}

// After a complete histogram of the candidates' digits of `level` (and a barrier): find the bin of
// the need-th largest candidate and narrow the state to it. Ends with a barrier.
template <int kWarpSize>
__device__ __forceinline__ void select_bin(Shared& sh, Select& st, int level) {
  const uint32_t first = thread_id_x() * kBinsPerThread;
  uint32_t h[kBinsPerThread];
  uint32_t local = 0;
#pragma unroll
  for (int b = 0; b < kBinsPerThread; ++b) {
    h[b] = sh.hist[first + b];
    local += h[b];
  }
  uint32_t total;
  const uint32_t excl = block_exclusive_scan<kWarpSize>(local, sh.wave_sums, total);
  uint32_t acc = total - excl - local;  // candidates in the bins of higher threads
#pragma unroll
  for (int b = kBinsPerThread - 1; b >= 0; --b) {
    if (acc < st.need && acc + h[b] >= st.need) {  // exactly one bin of the workgroup
      sh.bin = first + uint32_t(b);
      sh.above = acc;
      sh.count = h[b];
    }
    acc += h[b];
  }
  block_sync();
  st.prefix |= sh.bin << level_shift(level);
  st.mask = level_mask(level);
  st.need -= sh.above;
  st.count = sh.count;
  st.done = (st.need == st.count || level == 2) ? 1u : 0u;
}

// Histogram of `level`'s digit of the candidates among the keys [lo, hi) of the row.
template <int kDtype>
__device__ __forceinline__ void hist_window(Shared& sh, const void* row, int64_t lo, int64_t hi, const Select& st,
                                            int level, uint32_t nan_key) {
  int64_t i = lo + thread_id_x();
  for (; i + 3 * kThreads < hi; i += 4 * kThreads) {
    uint32_t key[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      key[j] = load_key<kDtype>(row, i + j * kThreads, nan_key);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if ((key[j] & st.mask) == st.prefix) {
        lds_atomic_add(&sh.hist[digit(key[j], level)], 1u);
      }
    }
  }
  for (; i < hi; i += kThreads) {
    const uint32_t key = load_key<kDtype>(row, i, nan_key);
    if ((key & st.mask) == st.prefix) {
      lds_atomic_add(&sh.hist[digit(key, level)], 1u);
    }
  }
}

// The ordered write of the keys [lo, hi) of a row: keys with (key & mask) > prefix, and keys equal
// to the prefix while fewer than `need` were taken, go to output slots in index order. run_gt and
// run_eq: keys of each kind before lo (earlier parts of a split row).
template <int kWarpSize, int kDtype>
__device__ __forceinline__ void ordered_write(Shared& sh, const void* row, int64_t lo, int64_t hi, const Select& st,
                                              int64_t k, uint32_t run_gt, uint32_t run_eq, const RowOut& o,
                                              uint32_t nan_key) {
  const uint32_t need = st.need;
  const int64_t tile = int64_t(kThreads) * kItems;
  for (int64_t base = lo; base < hi; base += tile) {
    if (int64_t(run_gt) + int64_t(run_eq < need ? run_eq : need) >= k) {
      break;  // all k written (uniform: the runs are workgroup-wide)
    }
    const int64_t i0 = base + int64_t(thread_id_x()) * kItems;
    uint32_t gt = 0;
    uint32_t eq = 0;
    uint32_t n_gt = 0;
    uint32_t n_eq = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (i0 + j < hi) {
        const uint32_t mk = load_key<kDtype>(row, i0 + j, nan_key) & st.mask;
        if (mk > st.prefix) {
          gt |= 1u << j;
          ++n_gt;
        } else if (mk == st.prefix) {
          eq |= 1u << j;
          ++n_eq;
        }
      }
    }
    uint32_t total;
    const uint32_t excl = block_exclusive_scan<kWarpSize>((n_gt << 16) | n_eq, sh.wave_sums, total);
    uint32_t g = run_gt + (excl >> 16);
    uint32_t e = run_eq + (excl & 0xFFFFu);
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if ((gt >> j) & 1u) {
        const int64_t pos = int64_t(g) + int64_t(e < need ? e : need);
        if (pos < k) {
          o.put(pos, i0 + j);
        }
        ++g;
      } else if ((eq >> j) & 1u) {
        if (e < need) {
          o.put(int64_t(g) + int64_t(e), i0 + j);
        }
        ++e;
      }
    }
    run_gt += total >> 16;
    run_eq += total & 0xFFFFu;
  }
}

__device__ __forceinline__ const void* row_ptr(const KernelArgs& a, int kDtype, int64_t row) {
  const char* base = static_cast<const char*>(a.scores);
  return base + row * a.row_stride * (kDtype == 0 ? 4 : 2);
}

// ---------------------------------------------------------------------------------------------
// One workgroup per row

// The row loops of this kernel and of topk_split_write_kernel take their fields from
// reread_arg0(args) once per row: the arguments are read where used instead of living in SGPRs
// across the kernel beside the select and write state (which spilled SGPRs on gfx950).
template <int kWarpSize, int kDtype>
__global__ void __launch_bounds__(kThreads) topk_row_kernel(KernelArgs args) {
  __shared__ Shared sh;
  const uint32_t tid = thread_id_x();
  for (int64_t row = block_id_x(); row < args.rows; row += args.grid) {
    const KernelArgs& a = reread_arg0(args);
    const Window w = window_of(a, row);
    const RowOut o = row_out(a, row, w.start);
    if (w.hi - w.lo <= a.k) {
      write_short(o, w, a.k);
      continue;
    }
    const void* rp = row_ptr(a, kDtype, row);
    Select st = select_init(a.k);
    clear_hist(sh);
    block_sync();
    hist_window<kDtype>(sh, rp, w.lo, w.hi, st, 0, a.nan_key);
    block_sync();
    select_bin<kWarpSize>(sh, st, 0);
    if (!st.done && st.count <= uint32_t(kTieCap)) {
      // The threshold bin's keys into the tie buffer; levels 1 and 2 run there.
      if (tid == 0) {
        sh.nbuf = 0u;
      }
      block_sync();
      for (int64_t i = w.lo + tid; i < w.hi; i += kThreads) {
        const uint32_t key = load_key<kDtype>(rp, i, a.nan_key);
        if ((key & st.mask) == st.prefix) {
          const uint32_t slot = lds_atomic_add(&sh.nbuf, 1u);
          if (slot < uint32_t(kTieCap)) {
            sh.tie[slot] = key;
          }
        }
      }
      const uint32_t nb = st.count;  // the bin's count: every candidate is in the buffer
      for (int level = 1; level < 3 && !st.done; ++level) {
        clear_hist(sh);
        block_sync();  // also orders the buffer's writes before its reads
        for (uint32_t j = tid; j < nb; j += kThreads) {
          const uint32_t key = sh.tie[j];
          if ((key & st.mask) == st.prefix) {
            lds_atomic_add(&sh.hist[digit(key, level)], 1u);
          }
        }
        block_sync();
        select_bin<kWarpSize>(sh, st, level);
      }
    } else {
      // Too many candidates (plateaus, heavy ties): rescan the window per level.
      for (int level = 1; level < 3 && !st.done; ++level) {
        clear_hist(sh);
        block_sync();
        hist_window<kDtype>(sh, rp, w.lo, w.hi, st, level, a.nan_key);
        block_sync();
        select_bin<kWarpSize>(sh, st, level);
      }
    }
    ordered_write<kWarpSize, kDtype>(sh, rp, w.lo, w.hi, st, a.k, 0u, 0u, o, a.nan_key);
  }
}

// ---------------------------------------------------------------------------------------------
// Row split: kernels over (row, part) pairs, or over rows, meeting in the workspace

__device__ __forceinline__ Select load_state(const KernelArgs& a, int64_t row) {
  const uint32_t* s = a.ws_state + row * 8;
  Select st;
  st.prefix = s[0];
  st.mask = s[1];
  st.need = s[2];
  st.count = s[3];
  st.done = s[4];
  return st;
}

struct Part {
  int64_t lo;
  int64_t hi;
};

__device__ __forceinline__ Part part_of(const Window& w, int64_t s, int64_t split) {
  const int64_t n = w.hi - w.lo;
  Part p;
  p.lo = w.lo + n * s / split;
  p.hi = w.lo + n * (s + 1) / split;
  return p;
}

// Level `level`'s histogram of one part of each row into the workspace.
template <int kWarpSize, int kDtype>
__global__ void __launch_bounds__(kThreads) topk_split_hist_kernel(KernelArgs a, int level) {
  __shared__ Shared sh;
  const int64_t pairs = a.rows * a.split;
  for (int64_t pr = block_id_x(); pr < pairs; pr += a.grid) {
    const int64_t row = pr / a.split;
    const Window w = window_of(a, row);
    if (w.hi - w.lo <= a.k) {
      continue;
    }
    const Select st = level == 0 ? select_init(a.k) : load_state(a, row);
    if (st.done) {
      continue;
    }
    const Part p = part_of(w, pr - row * a.split, a.split);
    clear_hist(sh);
    block_sync();
    hist_window<kDtype>(sh, row_ptr(a, kDtype, row), p.lo, p.hi, st, level, a.nan_key);
    block_sync();
    uint32_t* dst = a.ws_hist + pr * kBins;
    for (int b = int(thread_id_x()); b < kBins; b += kThreads) {
      dst[b] = sh.hist[b];
    }
    block_sync();
  }
}

// One workgroup per row: sum the parts' histograms of `level` and advance the select state.
template <int kWarpSize>
__global__ void __launch_bounds__(kThreads) topk_split_merge_kernel(KernelArgs a, int level) {
  __shared__ Shared sh;
  for (int64_t row = block_id_x(); row < a.rows; row += a.grid) {
    const Window w = window_of(a, row);
    if (w.hi - w.lo <= a.k) {
      continue;
    }
    Select st = level == 0 ? select_init(a.k) : load_state(a, row);
    if (st.done) {
      continue;
    }
    const uint32_t* src = a.ws_hist + row * a.split * kBins;
    for (int b = int(thread_id_x()); b < kBins; b += kThreads) {
      uint32_t sum = 0;
      for (int s = 0; s < a.split; ++s) {
        sum += src[int64_t(s) * kBins + b];
      }
      sh.hist[b] = sum;
    }
    block_sync();
    select_bin<kWarpSize>(sh, st, level);
    if (thread_id_x() == 0) {
      uint32_t* d = a.ws_state + row * 8;
      d[0] = st.prefix;
      d[1] = st.mask;
      d[2] = st.need;
      d[3] = st.count;
      d[4] = st.done;
    }
  }
}

// Per part: keys above the final threshold, keys equal to it.
template <int kWarpSize, int kDtype>
__global__ void __launch_bounds__(kThreads) topk_split_count_kernel(KernelArgs a) {
  __shared__ Shared sh;
  const int64_t pairs = a.rows * a.split;
  for (int64_t pr = block_id_x(); pr < pairs; pr += a.grid) {
    const int64_t row = pr / a.split;
    const Window w = window_of(a, row);
    if (w.hi - w.lo <= a.k) {
      continue;
    }
    const Select st = load_state(a, row);
    const Part p = part_of(w, pr - row * a.split, a.split);
    if (thread_id_x() == 0) {
      sh.above = 0u;
      sh.count = 0u;
    }
    block_sync();
    const void* rp = row_ptr(a, kDtype, row);
    uint32_t n_gt = 0;
    uint32_t n_eq = 0;
    for (int64_t i = p.lo + thread_id_x(); i < p.hi; i += kThreads) {
      const uint32_t mk = load_key<kDtype>(rp, i, a.nan_key) & st.mask;
      n_gt += mk > st.prefix ? 1u : 0u;
      n_eq += mk == st.prefix ? 1u : 0u;
    }
    if (n_gt != 0u) {
      lds_atomic_add(&sh.above, n_gt);
    }
    if (n_eq != 0u) {
      lds_atomic_add(&sh.count, n_eq);
    }
    block_sync();
    if (thread_id_x() == 0) {
      a.ws_cnt[pr * 2] = sh.above;
      a.ws_cnt[pr * 2 + 1] = sh.count;
    }
    block_sync();
  }
}

// Per part: the ordered write, after the taken keys of the parts before it.
template <int kWarpSize, int kDtype>
__global__ void __launch_bounds__(kThreads) topk_split_write_kernel(KernelArgs args) {
  __shared__ Shared sh;
  const int64_t pairs = args.rows * args.split;
  for (int64_t pr = block_id_x(); pr < pairs; pr += args.grid) {
    const KernelArgs& a = reread_arg0(args);
    const int64_t row = pr / a.split;
    const int64_t s = pr - row * a.split;
    const Window w = window_of(a, row);
    const RowOut o = row_out(a, row, w.start);
    if (w.hi - w.lo <= a.k) {
      if (s == 0) {
        write_short(o, w, a.k);
      }
      continue;
    }
    const Select st = load_state(a, row);
    uint32_t run_gt = 0;
    uint32_t run_eq = 0;
    for (int64_t q = row * a.split; q < pr; ++q) {
      run_gt += a.ws_cnt[q * 2];
      run_eq += a.ws_cnt[q * 2 + 1];
    }
    const Part p = part_of(w, s, a.split);
    ordered_write<kWarpSize, kDtype>(sh, row_ptr(a, kDtype, row), p.lo, p.hi, st, a.k, run_gt, run_eq, o,
                                     a.nan_key);
  }
}

template <int kDtype>
void launch_dtype(KernelArgs a, hipStream_t stream) {
  constexpr int W = DSA_WARP_SIZE;
  const dim3 block(kThreads);
  const uint32_t row_blocks = uint32_t(a.rows < int64_t(kMaxBlocks) ? a.rows : int64_t(kMaxBlocks));
  if (a.split <= 1) {
    a.grid = row_blocks;
    hipLaunchKernelGGL((topk_row_kernel<W, kDtype>), dim3(a.grid), block, 0, stream, a);
    return;
  }
  const int64_t pairs = a.rows * a.split;
  const uint32_t pair_blocks = uint32_t(pairs < int64_t(kMaxBlocks) ? pairs : int64_t(kMaxBlocks));
  KernelArgs r = a;
  r.grid = row_blocks;
  a.grid = pair_blocks;
  for (int level = 0; level < 3; ++level) {
    hipLaunchKernelGGL((topk_split_hist_kernel<W, kDtype>), dim3(a.grid), block, 0, stream, a, level);
    hipLaunchKernelGGL((topk_split_merge_kernel<W>), dim3(r.grid), block, 0, stream, r, level);
  }
  hipLaunchKernelGGL((topk_split_count_kernel<W, kDtype>), dim3(a.grid), block, 0, stream, a);
  hipLaunchKernelGGL((topk_split_write_kernel<W, kDtype>), dim3(a.grid), block, 0, stream, a);
}

}  // namespace topk_detail

hipError_t launch_topk(const TopkParams& p, hipStream_t stream) {
  namespace d = topk_detail;
  if (p.rows <= 0 || p.k <= 0) {
    return hipSuccess;
  }
  d::KernelArgs a = {};
  a.scores = p.scores;
  a.rows = p.rows;
  a.width = p.width;
  a.row_stride = p.row_stride;
  a.k = p.k;
  a.lengths = p.lengths;
  a.lengths_stride = p.lengths_stride;
  a.row_starts = p.row_starts;
  a.row_starts_stride = p.row_starts_stride;
  a.out = p.out;
  a.out_stride = p.out_stride;
  a.out_raw = p.out_raw;
  a.out_raw_stride = p.out_raw_stride;
  a.mode = int32_t(p.mode);
  int log2_page = 0;
  while (log2_page < 31 && (int64_t{1} << log2_page) < p.page_size) {
    ++log2_page;
  }
  a.log2_page = log2_page;
  a.page_table = p.page_table;
  a.batches = p.batches;
  a.max_pages = p.max_pages;
  a.page_table_stride = p.page_table_stride;
  a.row_to_batch = p.row_to_batch;
  a.row_to_batch_stride = p.row_to_batch_stride;
  a.pt_row_starts = p.page_table_row_starts;
  a.pt_row_starts_stride = p.page_table_row_starts_stride;
  a.offsets = p.offsets;
  a.offsets_stride = p.offsets_stride;
  a.nan_key = p.nan_first ? 0xFFFFFFFFu : 0u;
  a.split = (p.split > 1 && p.workspace != nullptr) ? (p.split < kTopkMaxSplit ? p.split : kTopkMaxSplit) : 1;
  if (a.split > 1) {
    const int64_t pairs = p.rows * a.split;
    a.ws_hist = p.workspace;
    a.ws_cnt = a.ws_hist + pairs * kTopkBins;
    a.ws_state = a.ws_cnt + pairs * 2;
  }
  switch (p.dtype) {
    case TopkDtype::kFloat32:
      d::launch_dtype<0>(a, stream);
      break;
    case TopkDtype::kBFloat16:
      d::launch_dtype<1>(a, stream);
      break;
    default:
      d::launch_dtype<2>(a, stream);
      break;
  }
  return hipGetLastError();
}

}  // namespace dsa_hip
