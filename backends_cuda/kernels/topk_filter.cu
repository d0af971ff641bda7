// The filter kernel of the top-k family (deterministic=False): exact, outputs in any order.
// Torch-free: the compile gates build this file alone with nvcc.
//
// One CTA of 512 threads per row (two per SM; many rows of 8K to 48K keys: 256 threads, four per
// SM, the narrow shape below), or a thread-block cluster per row when few long rows would leave SMs
// idle. Keys are the order-preserving uint32 of common_radix_select.cuh.
//
// Fast path, one read of the row:
//   1. Sample: 2048 to 16384 keys (evenly spaced runs of kSampleRun) give a threshold E such that, with
//      high probability, k to about 2k keys of the window are >= E (E = 0, every key, when the window
//      fits the candidate buffer).
//   2. Filter: one pass over device memory (cp.async, 16 keys per thread a round, the next
//      round in flight) appends every key >= E, as raw bits with its column, to a shared-memory candidate
//      buffer (one shared atomic per warp and round); the candidates are then converted to keys. A
//      split row's CTAs each fill their own buffer, from 512-byte chunks of the window dealt in turn.
//   3. Finish: when k <= candidates <= capacity, the threshold bin: a one-CTA row bins its candidates
//      as it converts them, 2048 bins over [E, the samples' largest key], and one scan of them finds
//      it (unless the samples reach +inf or E is a plateau value, or the bin is the top one or too big
//      to rank); else a radix select on the candidates (its bins over their own range, so one level
//      usually suffices) finds it. The keys above it are written, and the bin's entries are all taken,
//      ranked (key, then smallest column; one thread an entry) when there are at most 256, or split by
//      a second select on the columns when they are more ties of one key. From kSpreadFinishMinCluster
//      CTAs a row up, each CTA keeps its candidates: one level of select on their histograms (binned
//      during the filter pass and sent with the counts, one_round_select; else each CTA summing a slice
//      of the bins for all, hist_select), then each CTA writes its own above the threshold bin and sends
//      its bin entries to rank 0, which ranks them. Below that (and for a spread row whose candidates are
//      one value), a split row whose candidates fit one buffer gathers them into rank 0, which selects
//      alone and writes them all. Otherwise (more candidates, or a threshold bin that needs more levels)
//      the CTAs keep theirs and run the select's levels on histograms summed through distributed shared
//      memory; each writes its own, with output positions from rank 0, which also ranks a small
//      threshold bin.
// Plateau path: when the samples say far more keys than the buffer holds would pass and the sampled
// threshold is one value V (relu zeros, all-equal rows, heavy ties), step 2 takes the keys above V
// only; if fewer than k, the first keys equal to V in index order complete the row (if the row has
// fewer of them than the sample suggested, the row is redone by the exact fallback).
// Exact fallback (the sample missed: fewer than k or too many candidates; one CTA, the whole
// window): radix levels over device memory until the threshold bin fits the buffer, one pass that
// writes the keys above the bin and gathers the bin, and the finish of step 3 on the bin. When the
// bin never fits (more than `capacity` keys equal to the k-th largest; a level whose bin holds one
// value ends the levels early), an ordered pass takes the first ties in index order and stops once
// it has enough.
#include "dsa_cuda/common_launch.cuh"
#include "dsa_cuda/common_radix_select.cuh"
#include "dsa_cuda/common_topk_row.cuh"
#include "dsa_cuda/sm90_topk_heuristics.cuh"
#include "dsa_cuda/topk.cuh"

#include <type_traits>

#ifdef DSA_TOPK_TRACE
#include <cstdio>
#endif

// Two shapes of the kernel, each its own translation unit (this file; topk_filter_narrow.cu defines
// DSA_TOPK_FILTER_NARROW and includes it), in their own namespaces:
//  - wide: 512 threads, two CTAs an SM; every row, split rows (clusters) included;
//  - narrow: 256 threads, four CTAs an SM (sm_100: three), its histogram in its stage buffer, one CTA a
//    row, for many rows of up to ~48K keys (chosen by topk_heuristics::narrow_rows): more rows in flight
//    an SM, so one row's selects and finish overlap others' streams (wide -> narrow at three CTAs an
//    SM: 4096x32768 240.8 -> 223.1 us, 19% fewer warp instructions; 4096x131072 3.8% and 256x131072
//    8.7% slower, fewer bytes in flight; H200). Three -> four CTAs an SM, one run: 4096x32768 214.8 ->
//    198.0 us, walk rows 245.8 -> 197.2, 4096x49152 270.9 -> 258.9; ties 314.6 -> 353.6 (4096 keys at
//    the k-th value do not count as fitting 4608 candidates: the plateau path's second read).
#ifdef DSA_TOPK_FILTER_NARROW
#define DSA_TOPK_FILTER_DETAIL topk_filter_narrow_detail
#else
#define DSA_TOPK_FILTER_DETAIL topk_filter_detail
#endif

namespace dsa_cuda {
namespace DSA_TOPK_FILTER_DETAIL {

using namespace topk_row;  // KernelArgs, RowOut, GlobalSrc, hist_add, hist_pass, row_window, ...

#ifdef DSA_TOPK_FILTER_NARROW
constexpr bool kNarrow = true;
#else
constexpr bool kNarrow = false;
#endif
constexpr int kThreads = kNarrow ? 256 : 512;
// CTAs an SM: the launch bounds' (so 64 registers a thread for four) and the least the launcher accepts.
// (sm_100a: the narrow fp32 kernel spills at 64 registers, nvcc 13.5: three there.)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
constexpr int kCtasPerSm = kNarrow ? 3 : 2;
#else
constexpr int kCtasPerSm = kNarrow ? 4 : 2;
#endif
[[maybe_unused]] constexpr int kMinCtasPerSm = kNarrow ? 3 : 2;
// The narrow shape's histogram shares the stage buffer (the filter pass, the stages' only user, uses no
// histogram), so that four CTAs fit an SM.
constexpr bool kHistInStage = kNarrow;
// Candidate (key, column) pairs in shared memory: with the histogram and the cp.async stages, kCtasPerSm
// CTAs fit on an SM (narrow: 52 KB of dynamic shared memory each, 222 KB an SM with the static and
// reserved bytes). 0.75 of it holds the ~3200 candidates the sampled threshold aims at for k = 2048 with
// its slack (narrow: normal rows of 8K-48K keys, CPU model); narrow, the 4096 keys at
// the k-th value of integer rows 0..7 at 32K keys take the plateau path's second read (5120 did so:
// 318.8 -> 381.8 us at 4096x32768; 6144 kept them on one read at three CTAs an SM).
constexpr int kCapacity = kNarrow ? 4608 : 8192;
// The samples sit in the candidate keys and columns and the stage buffer (free before the filter pass).
constexpr int kMaxSamples = kNarrow ? 8192 : 16384;
// The fast path runs for k <= kCapacity / kFastRatio: the sampled threshold aims at k to 0.75 kCapacity keys.
constexpr int kFastRatio = kNarrow ? 2 : 4;
// cp.async stages of the filter pass: one 16-byte vector per thread each.
constexpr int kStages = 4;
// A split row's CTAs filter the window in chunks of this many 16-byte vectors (one warp's), dealt in turn.
constexpr int kChunkVecs = 32;
static_assert(kMaxSamples <= 2 * kCapacity + kStages * kThreads * 4, "the samples fit their buffer");
static_assert(!kHistInStage || kMaxSamples <= 2 * kCapacity, "the samples leave the histogram (in the stages) alone");
static_assert(!kHistInStage || kStages * kThreads * 16 >= radix::kBins * 4, "the histogram fits the stages");
constexpr uint32_t kMaxClusterCtas = topk_heuristics::kMaxCluster;
constexpr int kDynSmem = (kHistInStage ? 0 : radix::kBins * 4) + kCapacity * 8 + kStages * kThreads * 16;

// Phase timestamps of a few CTAs (dev builds with -DDSA_TOPK_TRACE only): SM clock stamps kept in
// shared memory at each phase boundary and printed once when the CTA ends, so the printing does not
// perturb the phases.
#ifdef DSA_TOPK_TRACE
constexpr int kTraceMax = 24;
__shared__ long long trace_clock[kTraceMax];
__shared__ unsigned long long trace_ns[kTraceMax];  // %globaltimer: comparable across SMs
__shared__ const char* trace_what[kTraceMax];
__shared__ int trace_count;
__device__ __forceinline__ void trace(const char* what) {
  __syncthreads();
  if (threadIdx.x == 0) {
    if (trace_count < kTraceMax) {
      trace_clock[trace_count] = clock64();
      unsigned long long ns;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
      trace_ns[trace_count] = ns;
      trace_what[trace_count] = what;
    }
    ++trace_count;
  }
}
__device__ __forceinline__ void trace_begin() {
  if (threadIdx.x == 0) {
    trace_count = 0;
  }
  trace("start");
}
__device__ __forceinline__ void trace_end() {
  // (every 512th CTA, and the first 16: a decode launch's first rows, every CTA of their clusters)
  if (threadIdx.x == 0 && ((blockIdx.x % 512) == 0 || blockIdx.x < 16)) {
    const int n = trace_count < kTraceMax ? trace_count : kTraceMax;
    for (int i = 1; i < n; ++i) {
      printf("trace %u %s %lld %llu\n", blockIdx.x, trace_what[i], trace_clock[i] - trace_clock[i - 1], trace_ns[i]);
    }
  }
}
#else
__device__ __forceinline__ void trace(const char*) {}
__device__ __forceinline__ void trace_begin() {}
__device__ __forceinline__ void trace_end() {}
#endif

// A finish whose threshold bin holds at most this many entries ranks them by (key, column), one
// thread an entry, instead of running more select levels: 16-bit scores put tens of ties of one
// value in the bin, whose select on columns cost bf16 1x131072 a third of its time (32 -> 21 us, H200).
constexpr uint32_t kRankBin = 256;
static_assert(kRankBin <= kThreads && kRankBin % 32 == 0, "one thread an entry, whole warps");
// Entries of a small threshold bin compared a round when they are ranked (finish).
constexpr uint32_t kRankUnroll = 8;
static_assert(kRankBin % kRankUnroll == 0, "a round's entries stay inside the bin arrays");
// The finish's select runs its levels down to a bin of at most this many entries of mixed values.
constexpr uint32_t kWarpBin = 32;

// The largest level shift at which a bin of the finish's offset-space select holds one value at most:
// the fp32 keys of bf16 scores differ by 2^16 or more (fp16: 2^13; across zero by one more), so do
// their offsets; fp32 scores: none (-1).
template <typename T>
__host__ __device__ constexpr int one_value_shift() {
  return sizeof(T) == 4 ? -1 : std::is_same<T, __half>::value ? 13 : 16;
}

// (Its size, with SelectShared's, sets where the dynamic shared memory starts: 304 more bytes, unused,
// cost 2-10% on every streaming shape, H200. Measure any change to either struct.)
struct Counters {
  uint32_t cand;  // candidates appended (stored while < kCapacity)
  uint32_t out;   // outputs written
  uint32_t total;  // the row's candidates (all of a split row's CTAs'), or ~0 when they did not fit
  uint32_t before;  // split rows: the candidates of the lower ranks (where the gather puts this CTA's);
                    // a gathered row's rank 0 (0 there) then counts its own entries of a small bin (finish);
                    // a one-CTA row: the samples' largest key (its one-round bins' range, filter_row)
  uint32_t lo;    // a list's smallest and largest value (select_list)
  uint32_t hi;
  uint32_t lo_all;  // sample_threshold: the samples' smallest (cnt.lo: a bound below the j-th largest)
  uint32_t nbin;  // finish: entries of a small threshold bin gathered so far
  uint32_t runs;  // sample_threshold: sampled runs holding a sample at or above the threshold
  uint32_t few;   // the row's candidates all fit but are fewer than k (not at a plateau): retry wider
  uint32_t retried;  // the sampled path's second, wider attempt is running
  uint32_t bin_key[kRankBin];
  int32_t bin_col[kRankBin];
};

// A split row's exchanges (the split kernel's shared memory only): their barriers (radix::st_async)
// and every CTA's (candidates, lo, hi) of each attempt. xbar: the count exchange of each attempt, one
// phase each. gbar, a gathered row's (finish): on rank 0, phase 0 the gather of the candidates, phase
// 1 the other CTAs' entries of a small threshold bin; on the others, phase 0 rank 0's select, which
// lands in their histogram (dead there from the gather on). (With two more barriers and the select
// here the 2-CTA rows run as fast: 64x131072 walk 21.1 us both, H200; this form has fewer registers.)
// hbar (a spread row's histogram select): phase 0 of hbar[0] the other CTAs' bins of this CTA's slice,
// of hbar[1] the other slices' sums (two barriers: a fast CTA's sums may land before a slow one's bins).
struct Exchange {
  uint64_t xbar[2];
  uint64_t gbar;
  uint64_t hbar[2];
  uint32_t smax;  // the samples' largest key (one_round_bins)
  uint4 xs[2][kMaxClusterCtas];
};

// What a preselected split row does with the threshold bin's entries (finish): all taken, or ranked by
// rank 0, to which each CTA sends its own (at most kRankBin; rank 0 counts its own in cnt.before, 0 there).
enum class BinMode : uint32_t { kWhole = 0, kRank = 1 };

// Fold the warp's [lo, hi] into the row's list range cnt.lo / cnt.hi (reset by range_reset, with a
// barrier between). The warp must be converged.
__device__ __forceinline__ void range_add(uint32_t lo, uint32_t hi, Counters& cnt) {
  lo = __reduce_min_sync(0xFFFFFFFFu, lo);
  hi = __reduce_max_sync(0xFFFFFFFFu, hi);
  if ((threadIdx.x & 31) == 0) {
    atomicMin(&cnt.lo, lo);
    atomicMax(&cnt.hi, hi);
  }
}
__device__ __forceinline__ void range_reset(Counters& cnt) {
  if (threadIdx.x == 0) {
    cnt.lo_all = 0xFFFFFFFFu;
    cnt.lo = 0xFFFFFFFFu;
    cnt.hi = 0u;
  }
}

__device__ __forceinline__ uint32_t lanemask_lt() { return (1u << (threadIdx.x & 31)) - 1u; }

// Lane `leader`'s add to a shared-memory counter, returning the old value. (ptxas turns an atomic add
// at a warp-uniform address into a warp-aggregated one, a vote and a five-step scan, which the warp
// issues in full when one lane adds; the address is written to depend on the lane, zero offset on
// the leader, so it stays a plain one.)
__device__ __forceinline__ uint32_t lane_atomic_add(uint32_t* p, uint32_t v, uint32_t leader) {
  uint32_t lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(p)) + ((lane ^ leader) << 2);
  uint32_t old;
  asm volatile("atom.shared.add.u32 %0, [%1], %2;" : "=r"(old) : "r"(addr), "r"(v) : "memory");
  return old;
}

// The next free output position for every lane with `take` (one shared atomic per warp); false when no
// lane of the warp takes. The warp must be converged.
__device__ __forceinline__ bool reserve_outputs(bool take, uint32_t* counter, uint32_t& pos) {
  const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, take);
  if (ballot == 0u) {
    return false;
  }
  const int leader = __ffs(ballot) - 1;
  uint32_t base = 0;
  if (int(threadIdx.x & 31) == leader) {
    base = lane_atomic_add(counter, uint32_t(__popc(ballot)), uint32_t(leader));
  }
  base = __shfl_sync(0xFFFFFFFFu, base, leader);
  pos = base + uint32_t(__popc(ballot & lanemask_lt()));
  return true;
}

// Write `col` at the next free output position for every lane with `take`. The warp must be converged.
// (Its own reservation, not reserve_outputs': written through that, ptxas lays out the one-CTA kernels
// differently; kept byte-identical.)
__device__ __forceinline__ void emit(bool take, int64_t col, const RowOut& o, uint32_t* counter, uint32_t k) {
  const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, take);
  if (ballot == 0u) {
    return;
  }
  const int leader = __ffs(ballot) - 1;
  uint32_t base = 0;
  if (int(threadIdx.x & 31) == leader) {
    base = lane_atomic_add(counter, uint32_t(__popc(ballot)), uint32_t(leader));
  }
  base = __shfl_sync(0xFFFFFFFFu, base, leader);
  const uint32_t pos = base + uint32_t(__popc(ballot & lanemask_lt()));
  if (take && pos < k) {  // pos < k always holds; the guard keeps a bug from writing past the row
    o.put(pos, col);
  }
}

// As emit, for an entry whose output is already mapped (map(rel), or a page-table lookup issued earlier).
__device__ __forceinline__ void emit_mapped(bool take, int32_t rel, int32_t mapped, const RowOut& o,
                                            uint32_t* counter, uint32_t k) {
  uint32_t pos = 0;
  if (reserve_outputs(take, counter, pos) && take && pos < k) {
    o.put_mapped(pos, rel, mapped);
  }
}

// Inclusive sum over the warp's lanes (predicated shuffles: no select per step). The warp must be
// converged.
__device__ __forceinline__ uint32_t warp_inclusive_sum(uint32_t x) {
#pragma unroll
  for (uint32_t o = 1; o < 32; o <<= 1) {
    asm volatile("{\n .reg .u32 t;\n .reg .pred p;\n shfl.sync.up.b32 t|p, %0, %1, 0, 0xffffffff;\n @p add.u32 %0, %0, t;\n}"
                 : "+r"(x)
                 : "r"(o));
  }
  return x;
}

// Reserve `n` consecutive candidate slots per lane (one shared atomic per warp); returns the first.
// `counter` is this CTA's, or (owner >= 0) the same variable in cluster CTA `owner`. The warp must be
// converged; reserve_some: some lane of it has n > 0.
__device__ __forceinline__ uint32_t reserve_some(uint32_t n, uint32_t* counter, int owner = -1) {
  const uint32_t incl = warp_inclusive_sum(n);
  uint32_t base = 0;
  if ((threadIdx.x & 31) == 31) {
    base = owner >= 0 ? radix::cluster_atomic_add(counter, incl, uint32_t(owner)) : lane_atomic_add(counter, incl, 31u);
  }
  base = __shfl_sync(0xFFFFFFFFu, base, 31);
  return base + incl - n;
}
__device__ __forceinline__ uint32_t reserve(uint32_t n, uint32_t* counter, int owner = -1) {
  if (__ballot_sync(0xFFFFFFFFu, n != 0u) == 0u) {
    return 0u;
  }
  return reserve_some(n, counter, owner);
}

// List selects count with one shared atomic an entry (an increment, ATOMS.POPC.INC on sm_90), not
// hist_add's warp votes (~12 instructions an entry); on sm_10x the warp-vote form, since the plain one
// spills 4 bytes there at 64 registers.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
constexpr bool kPlainListAtomics = false;
#else
constexpr bool kPlainListAtomics = true;
#endif

// A select over a list, in offset space: d = value - base (base = the smallest valid value), so
// the first level's 2048 bins cover the list's actual range (keys above a threshold share their
// top bits: bins on the raw top 11 bits would put them all in a few, contended, bins).
// Entries with (d & mask) > prefix are taken; those with (d & mask) == prefix are `count`, of
// which `krem` are taken (all of them when count == krem; else mask is full: exact ties).
struct ListSelect {
  uint32_t base;
  SelectState st;
  __device__ __forceinline__ bool taken(uint32_t v) const {
    const uint32_t d = (v - base) & st.mask;
    return d > st.prefix || (d == st.prefix && st.count == st.krem);
  }
  __device__ __forceinline__ uint32_t value_at_prefix() const { return base + st.prefix; }
};

// After a level's histogram (and a barrier): narrow st to the bin of the krem-th largest entry
// (digits (d >> shift) & (2^kDigitBits - 1)). Ends with a barrier.
template <int kDigitBits = 11>
__device__ __forceinline__ void refine_at(const uint32_t* hist, int shift, SelectState& st, SelectShared& sh) {
  constexpr int kN = 1 << kDigitBits;
  static_assert(kN % kThreads == 0 || kThreads % kN == 0, "whole bins a thread, or a bin to each of the first threads");
  constexpr int per = kN >= kThreads ? kN / kThreads : 1;
  const int first = int(threadIdx.x) * per;
  const bool has = kN >= kThreads || first < kN;  // (fewer bins than threads: the rest count none)
  uint32_t local = 0;
#pragma unroll
  for (int b = 0; b < per; ++b) {
    local += has ? hist[first + b] : 0u;
  }
  uint32_t total;
  const uint32_t incl = radix::block_inclusive_scan(local, sh.scan[0], total);
  uint32_t acc = total - incl;  // entries in the bins above this thread's
#pragma unroll
  for (int b = per - 1; b >= 0; --b) {
    const uint32_t h = has ? hist[first + b] : 0u;
    if (acc < st.krem && acc + h >= st.krem) {  // exactly one bin in the block
      sh.bin = uint32_t(first + b);
      sh.above = acc;
      sh.count = h;
    }
    acc += h;
  }
  __syncthreads();
  st.prefix |= sh.bin << shift;  // (a clamped last level's digit repeats fixed bits: same values)
  st.mask = shift == 0 ? 0xFFFFFFFFu : ~((1u << shift) - 1u);
  st.krem -= sh.above;
  st.count = sh.count;
}

// A split row's finish runs on the union of the candidates of its cluster's CTAs, each CTA keeping
// its own: every CTA runs the same select on histograms summed over the cluster (so every CTA reaches
// the same state), then writes its own candidates. `csize` > 1 only there.

// merged[b] = the sum of bin b of `hist` over the cluster's CTAs (this CTA's `merged`).
__device__ __forceinline__ void merge_hists(const uint32_t* hist, uint32_t* merged, uint32_t csize) {
  for (int b = int(threadIdx.x); b < radix::kBins; b += kThreads) {
    uint32_t v[kMaxClusterCtas];
#pragma unroll
    for (uint32_t c = 0; c < kMaxClusterCtas; ++c) {  // all remote loads first: they overlap
      v[c] = c < csize ? radix::cluster_load(hist + b, c) : 0u;
    }
    uint32_t sum = 0;
#pragma unroll
    for (uint32_t c = 0; c < kMaxClusterCtas; ++c) {
      sum += v[c];
    }
    merged[b] = sum;
  }
}

// cnt.lo / cnt.hi (each CTA's own range) to the cluster's range. Ends with a barrier.
__device__ __forceinline__ void cluster_range(Counters& cnt, uint32_t csize) {
  radix::cluster_sync();  // every CTA's range is in place
  uint32_t lo = 0xFFFFFFFFu;
  uint32_t hi = 0u;
  for (uint32_t c = 0; c < csize; ++c) {
    lo = min(lo, radix::cluster_load(&cnt.lo, c));
    hi = max(hi, radix::cluster_load(&cnt.hi, c));
  }
  radix::cluster_sync();  // every CTA read every range before it changes
  if (threadIdx.x == 0) {
    cnt.lo = lo;
    cnt.hi = hi;
  }
  __syncthreads();
}

// The shift of a list select's first level over values spanning `span` (> 0): 2^kDigitBits bins cover it.
template <int kDigitBits = 11>
__device__ __forceinline__ int first_shift(uint32_t span) {
  const int bits = 32 - __clz(span);
  return bits > kDigitBits ? bits - kDigitBits : 0;
}

// Add the valid entries under the select ((d & mask) == prefix, d = value - base) to `hist`, bin
// (d >> shift) & (2^kDigitBits - 1).
template <int kDigitBits = 11, class List>
__device__ __forceinline__ void list_hist(const List& list, int m, const ListSelect& sel, int shift, uint32_t* hist) {
  constexpr uint32_t kDigit = (1u << kDigitBits) - 1u;
  for (int base = 0; base < m; base += kThreads) {
    const int i = base + int(threadIdx.x);
    const bool in = i < m && list.valid(i);
    const uint32_t d = in ? list.value(i) - sel.base : 0u;
    const bool take = in && (d & sel.st.mask) == sel.st.prefix;
    if (kPlainListAtomics) {
      if (take) {
        atomicAdd(hist + ((d >> shift) & kDigit), 1u);
      }
    } else {
      hist_add(hist, take, (d >> shift) & kDigit);
    }
  }
}

// The valid entries' range into cnt.lo / cnt.hi. Starts and ends with a barrier.
template <class List>
__device__ __forceinline__ void list_range(const List& list, int m, Counters& cnt) {
  __syncthreads();  // earlier readers of cnt.lo / cnt.hi are done
  range_reset(cnt);
  __syncthreads();
  uint32_t lo = 0xFFFFFFFFu;
  uint32_t hi = 0u;
  for (int base = 0; base < m; base += kThreads) {
    const int i = base + int(threadIdx.x);
    if (i < m && list.valid(i)) {
      const uint32_t v = list.value(i);
      lo = min(lo, v);
      hi = max(hi, v);
    }
  }
  range_add(lo, hi, cnt);
  __syncthreads();
}

// The r-th largest of the m list entries (`valid` of them: r <= valid), whose range is in cnt.lo /
// cnt.hi. Stops early once the entries at or above the bin number at most r + slack (slack 0: the
// exact select), or once the bin holds at most `small` entries. Ends with a barrier, except when
// valid == r: every entry is taken, and it returns at once, having read and written nothing shared
// (sample_threshold's calls never take that exit: k <= kCapacity / kFastRatio < n keeps their r below S).
// csize > 1: the list is the union of the cluster's CTAs' lists (m: this CTA's entries; valid: the
// cluster's; cnt.lo / cnt.hi: the cluster's range); `merged` holds the summed histograms.
// one_value_shift: the largest shift at which a bin can hold only one value (see one_value_shift<T>).
// hist: 2048 words, 16-byte aligned (cleared with 16-byte stores).
template <class List>
__device__ __forceinline__ ListSelect select_list(const List& list, int m, uint32_t r, uint32_t valid,
                                                  uint32_t slack, uint32_t small, uint32_t* hist, Counters& cnt,
                                                  SelectShared& sh, uint32_t* merged = nullptr,
                                                  uint32_t csize = 1, int one_value_shift = -1) {
  ListSelect sel{0u, SelectState{0u, 0u, r, valid}};
  if (valid == r) {
    return sel;  // every entry is taken
  }
  sel.base = cnt.lo;
  const uint32_t span = cnt.hi - cnt.lo;
  if (span == 0u) {  // one value: exact ties
    sel.st.mask = 0xFFFFFFFFu;
    __syncthreads();  // everyone read cnt.lo / cnt.hi
    return sel;
  }
  for (int shift = first_shift(span);; shift = shift > 11 ? shift - 11 : 0) {
    radix::clear_hist_block<kThreads>(hist);
    __syncthreads();  // (the first one also ends the reads of cnt.lo / cnt.hi)
    list_hist(list, m, sel, shift, hist);
    __syncthreads();
    trace("l_hist");
    if (csize > 1) {
      radix::cluster_sync();  // every CTA's histogram of this level is complete
      merge_hists(hist, merged, csize);
      __syncthreads();
      refine_at(merged, shift, sel.st, sh);
      radix::cluster_sync();  // every CTA read every histogram: they may be cleared
    } else {
      refine_at(hist, shift, sel.st, sh);
    }
    trace("level");
    // (at shifts up to one_value_shift a bin holds one value: stop at once when the finish can rank it)
    const uint32_t small_here = shift <= one_value_shift ? kRankBin : small;
    if (shift == 0 || (r - sel.st.krem) + sel.st.count <= r + slack || sel.st.count <= small_here) {
      return sel;
    }
  }
}

// A list of values in shared memory to select on: the candidates' keys, or their inverted columns
// restricted to the keys equal to `tie` (so the largest values are the smallest columns).
struct KeyList {
  const uint32_t* keys;
  __device__ __forceinline__ bool valid(int) const { return true; }
  __device__ __forceinline__ uint32_t value(int i) const { return keys[i]; }
};
// The keys at or above `from` only (the sample select's list: `from` is a bound below its answer).
struct KeysFromList {
  const uint32_t* keys;
  uint32_t from;
  __device__ __forceinline__ bool valid(int i) const { return keys[i] >= from; }
  __device__ __forceinline__ uint32_t value(int i) const { return keys[i]; }
};
struct TieColumnList {
  const uint32_t* keys;
  const int32_t* cols;
  uint32_t tie;
  __device__ __forceinline__ bool valid(int i) const { return keys[i] == tie; }
  __device__ __forceinline__ uint32_t value(int i) const { return ~uint32_t(cols[i]); }
};

// hist_select's bins: 512. Every bin crosses the cluster twice (a CTA's slices out, the slices' sums
// back). With 2048 bins its two rounds took 1x131072 1.7 and 1.1 us, with 512 1.5 and 1.0 (H200
// globaltimer stamps: a round costs about a microsecond whatever its size), and the
// whole row 0.3-0.8 us less than with 2048 (the smaller refine); a normal row's threshold bin stays well
// under kRankBin entries.
constexpr int kHistSelectBits = 9;
constexpr uint32_t kHistSelectBins = 1u << kHistSelectBits;

// Bins of the merged histogram that CTA s of a cluster of csize sums (hist_select): slice s, bins
// [s * len, (s + 1) * len) with len = kHistSelectBins / csize rounded up to whole 16-byte vectors (the
// last slice shorter, never empty for csize <= 8).
__device__ __forceinline__ uint32_t slice_len(uint32_t csize) { return ((kHistSelectBins + csize - 1u) / csize + 3u) & ~3u; }
__device__ __forceinline__ uint32_t slice_bins(uint32_t s, uint32_t len) { return min(len, kHistSelectBins - s * len); }

// A spread split row's select on the union of its CTAs' candidates without gathering them (nor running
// a cluster barrier): each CTA counts its own m candidates into `hist` (cleared, with a barrier since)
// over the cluster's range cnt.lo .. cnt.hi (lo < hi); CTA s receives every other CTA's slice s of bins
// (st.async into `inbox`, csize slices of slice_len words), sums it and sends the sums to every other CTA,
// so every CTA refines the same merged histogram. One level: true, with `sel` and `mode`, when the
// threshold bin is taken whole or holds at most kRankBin entries (ranked by rank 0); false when it needs
// more (the caller runs the cluster-wide finish). Every CTA of the cluster calls it once a row (the
// barriers' phase 0). r: the entries to take (1 <= r <= total, the cluster's candidates). Ends with a
// barrier. (Against a gather of every candidate into rank 0, ~40 KB into one SM, and rank 0's lone
// select, the select reaches every CTA of a 1x131072 row 0.3 us sooner, 9.06 against 9.38 us after the
// samples landed, H200 globaltimer stamps.)
__device__ __forceinline__ bool hist_select(const uint32_t* keys, int m, uint32_t r, uint32_t total, uint32_t* hist,
                                            uint32_t* inbox, Counters& cnt, SelectShared& sh, Exchange* ex,
                                            uint32_t csize, uint32_t rank, ListSelect& sel, BinMode& mode) {
  const uint32_t len = slice_len(csize);
  const uint32_t mine = slice_bins(rank, len);
  if (threadIdx.x == 0) {
    radix::xbar_expect(&ex->hbar[0], (csize - 1u) * mine * 4u);
    radix::xbar_expect(&ex->hbar[1], (kHistSelectBins - mine) * 4u);
  }
  sel = ListSelect{cnt.lo, SelectState{0u, 0u, r, total}};
  const int shift = first_shift<kHistSelectBits>(cnt.hi - cnt.lo);
  list_hist<kHistSelectBits>(KeyList{keys}, m, sel, shift, hist);
  __syncthreads();
  // Slice s of this CTA's bins to CTA s, at inbox[rank * len] there: a 16-byte vector a thread.
  const uint32_t vecs = len / 4u;
  for (uint32_t q = threadIdx.x; q < csize * vecs; q += kThreads) {
    const uint32_t s = q / vecs;
    const uint32_t b = s * len + 4u * (q % vecs);
    if (s != rank && b < kHistSelectBins) {
      radix::st_async(reinterpret_cast<uint4*>(inbox + rank * len + (b - s * len)),
                      *reinterpret_cast<const uint4*>(hist + b), s, &ex->hbar[0]);
    }
  }
  radix::xbar_wait(&ex->hbar[0], 0u);
  trace("h_slices");
  uint32_t* own = hist + rank * len;
  for (uint32_t i = threadIdx.x; i < mine; i += kThreads) {
    uint32_t sum = own[i];
    for (uint32_t c = 0; c < csize; ++c) {
      sum += c != rank ? inbox[c * len + i] : 0u;
    }
    own[i] = sum;
  }
  __syncthreads();
  // The sums of this CTA's slice to the same bins of every other CTA's histogram.
  const uint32_t mine_vecs = mine / 4u;
  for (uint32_t q = threadIdx.x; q < (csize - 1u) * mine_vecs; q += kThreads) {
    const uint32_t p = q / mine_vecs;
    radix::st_async(reinterpret_cast<uint4*>(own + 4u * (q % mine_vecs)),
                    *reinterpret_cast<const uint4*>(own + 4u * (q % mine_vecs)), p < rank ? p : p + 1u, &ex->hbar[1]);
  }
  radix::xbar_wait(&ex->hbar[1], 0u);
  refine_at<kHistSelectBits>(hist, shift, sel.st, sh);
  trace("h_select");
  if (sel.st.count == sel.st.krem) {
    mode = BinMode::kWhole;
    return true;
  }
  mode = BinMode::kRank;
  return sel.st.count <= kRankBin;
}

// The one-round select of a spread split row (first attempt, sampled, not at a plateau): each CTA bins
// its candidates while it converts them (raw_to_keys) on a range every CTA knows before the filter pass,
// from the sampled threshold E to the samples' largest key (keys above it in the top bin), and sends its
// 256 bins with its count: every CTA sums the same histograms and refines, with no exchange after the
// count exchange (hist_select's two rounds take 2.5 us of 1x131072, H200 stamps).
// Bin slots: CTA c's bins at hist[c * 256] of every CTA (8 x 256 words: the whole histogram buffer,
// which the other CTAs may write once this CTA has passed the cluster barrier after its sample select).
// A one-CTA row (first attempt, sampled, not at a plateau) bins its candidates the same way, into its
// whole histogram (2048 bins: about 4 candidates a bin at 32K normal keys, k 2048), and takes the
// threshold bin from one scan of it instead of a level over the candidates.
constexpr int kOneRoundBits = 8;
constexpr uint32_t kOneRoundBins = 1u << kOneRoundBits;
static_assert(kOneRoundBins * kMaxClusterCtas <= uint32_t(radix::kBins), "every CTA's bins fit the histogram");
constexpr int kRowRoundBits = 11;
static_assert((1 << kRowRoundBits) == radix::kBins, "a one-CTA row's bins are its histogram");
constexpr uint32_t kInfKey = 0xFF800000u;  // +inf's key (radix::float_key)
template <int kBits = kOneRoundBits>
struct OneRoundBins {
  static constexpr uint32_t kTop = (1u << kBits) - 1u;
  uint32_t base;  // E
  int shift;
  __device__ __forceinline__ OneRoundBins(uint32_t E, uint32_t smax)
      : base(E), shift(smax > E ? first_shift<kBits>(smax - E) : 0) {}
  // (candidates are >= E; keys above the samples' largest go to the top bin)
  __device__ __forceinline__ uint32_t bin(uint32_t key) const { return min((key - base) >> shift, kTop); }
};

// Sum the cluster's bins into this CTA's slot (a one-CTA row: its own bins) and refine: true, with `sel`
// and `mode`, when the threshold bin is not the top one (whose keys do not share a prefix) and is taken
// whole or holds at most `small` entries; false sends the row to a select on its candidates. Every CTA
// of the cluster calls it with the same bins. Starts after the count exchange (every slot in place);
// ends with a barrier.
template <int kBits = kOneRoundBits>
__device__ __forceinline__ bool one_round_select(uint32_t* hist, const OneRoundBins<kBits>& bins, uint32_t r,
                                                 uint32_t total, uint32_t csize, uint32_t rank, SelectShared& sh,
                                                 ListSelect& sel, BinMode& mode, uint32_t small = kRankBin) {
  static_assert(kBits == kOneRoundBits || kBits == kRowRoundBits, "a split row's slots or a one-CTA row's bins");
  uint32_t* own = hist + rank * kOneRoundBins;
  if (csize > 1) {
    uint32_t sum = 0;
    if (threadIdx.x < kOneRoundBins) {
      for (uint32_t c = 0; c < csize; ++c) {
        sum += hist[c * kOneRoundBins + threadIdx.x];
      }
    }
    __syncthreads();  // every slot read
    if (threadIdx.x < kOneRoundBins) {
      own[threadIdx.x] = sum;
    }
    __syncthreads();
  }
  trace("o_summed");
  sel = ListSelect{bins.base, SelectState{0u, 0u, r, total}};
  refine_at<kBits>(own, bins.shift, sel.st, sh);
  trace("o_select");
  const bool top = (sel.st.prefix >> bins.shift) == bins.kTop;
  mode = sel.st.count == sel.st.krem ? BinMode::kWhole : BinMode::kRank;
  return !top && (sel.st.count == sel.st.krem || sel.st.count <= small);
}

// Outputs pos, pos + 1, ... of a warp: the n relative columns it staged (entry j at
// staged[(j / 32) * kThreads + j % 32]), kSteps a lane a step, converged and coalesced. kLookupsFirst
// (page-table form): a step's lookups are all issued before any is used (map() after map() waits for
// each load in turn: 4096x32768's page-table form took 1.09x topk, 1.065x so, H200).
template <uint32_t kSteps, bool kLookupsFirst>
__device__ __forceinline__ void write_staged(const uint32_t* staged, uint32_t n, uint32_t pos, const RowOut& o,
                                             uint32_t k) {
  const uint32_t lane = threadIdx.x & 31u;
  for (uint32_t j0 = 0; j0 < n; j0 += 32u * kSteps) {
    int32_t rel[kSteps];
    int32_t mapped[kSteps];
#pragma unroll
    for (uint32_t u = 0; u < kSteps; ++u) {
      const uint32_t j = j0 + 32u * u + lane;
      rel[u] = j < n ? int32_t(int64_t(int32_t(staged[(j >> 5) * kThreads + lane])) - o.start) : 0;
    }
    if (kLookupsFirst) {
      int32_t page[kSteps];
#pragma unroll
      for (uint32_t u = 0; u < kSteps; ++u) {
        page[u] = o.page_of(rel[u], j0 + 32u * u + lane < n);
      }
#pragma unroll
      for (uint32_t u = 0; u < kSteps; ++u) {
        mapped[u] = o.of_page(rel[u], page[u]);
      }
    } else {
#pragma unroll
      for (uint32_t u = 0; u < kSteps; ++u) {
        mapped[u] = o.map(rel[u]);
      }
    }
    // (one address a batch, the steps at immediate offsets; o.out_raw is block-uniform)
    int32_t* const out_at = o.out + (pos + j0 + lane);
    int32_t* const raw_at = o.out_raw != nullptr ? o.out_raw + (pos + j0 + lane) : nullptr;
#pragma unroll
    for (uint32_t u = 0; u < kSteps; ++u) {
      const uint32_t j = j0 + 32u * u + lane;
      if (j < n && pos + j < k) {  // (pos + j < k always: exactly the r entries asked for are taken)
        out_at[32u * u] = mapped[u];
        if (raw_at != nullptr) {
          raw_at[32u * u] = rel[u];
        }
      }
    }
  }
}

// The r largest of the m candidates (ties: smallest columns) to the output. The candidates' range
// is in cnt.lo / cnt.hi. After the select, one of: the whole threshold bin is taken; the bin holds
// at most kRankBin entries, which are gathered and ranked by (key, column); or the bin is one key
// with more ties than needed, split by a second select on the inverted columns.
// csize > 1: the candidates are the union of the cluster's CTAs' (m: this CTA's, `valid` of them in
// all; cnt.lo / cnt.hi: the cluster's range; rank 0's cnt.out and cnt.nbin zeroed before the first
// cluster barrier after the filter pass). Each CTA writes its own; output positions and the small
// threshold bin's entries go to rank 0, which ranks the bin. `merged`: 2048 words for the summed
// histograms. Every CTA of the cluster calls it. The keys are overwritten (the writes stage columns there).
// kLookupsInFlight: the page-table form's writes issue their lookups before using them (write_staged;
// see lookups_in_flight).
// kGathered, not kPreselected (a split row whose candidates fit one buffer): rank 0 alone, with csize 1,
// on the cluster's m candidates gathered into its buffer; it selects and writes everything.
// kPreselected (a spread row whose every CTA ran one_round_select or hist_select): the select given
// (`pre`, `pre_mode`: whole or ranked bin), every CTA of the cluster writes its own m candidates above
// the threshold bin and sends its entries of a small bin to rank 0 on its gbar's phase 0, which ranks
// them (rank 0's take and writes of all 2048 took 1x131072 2.4 us, 1.2 so, H200 phase stamps); rank 0
// returns once the others' writes are done. kPreselected, not kGathered, csize 1: a one-CTA row after its
// one_round_select; it writes everything and ranks its own bin's entries.
template <bool kLookupsInFlight, bool kGathered = false, bool kPreselected = false>
__device__ __forceinline__ void finish(uint32_t* keys, const int32_t* cols, int m, uint32_t r,
                                       const RowOut& o, uint32_t* hist, Counters& cnt, uint32_t k,
                                       SelectShared& sh, int one_value_shift, uint32_t valid = 0u,
                                       uint32_t* merged = nullptr, uint32_t csize = 1, uint32_t rank = 0,
                                       Exchange* ex = nullptr,
                                       ListSelect pre = ListSelect{0u, SelectState{0u, 0u, 0u, 0u}},
                                       BinMode pre_mode = BinMode::kWhole) {
  const bool cluster = !kGathered && csize > 1;  // the cluster-wide finish
  const bool selects = !kPreselected;  // (a preselected row has it on every CTA)
  const bool remote = cluster || (kGathered && rank != 0);  // this CTA reserves on rank 0's counters
  if (!cluster && !kPreselected) {  // (a preselected row's rank 0 may already count the others' entries:
    valid = uint32_t(m);            // cnt.nbin is 0 from the row's start)
    if (threadIdx.x == 0) {
      cnt.nbin = 0u;  // (ordered before its use by the select's barriers)
    }
  }
  // Levels stop at a bin of kWarpBin entries (mixed values: one more level is cheaper than ranking
  // them; nan_inf 4096x32768 took 378 -> 489 us when they stopped at kRankBin), or of kRankBin once a
  // bin can hold one value only (16-bit scores: tens of ties, which more levels cannot split).
  ListSelect ks{0u, SelectState{0u, 0u, 0u, 0u}};
  bool whole_bin = false;
  bool rank_bin = false;
  if (selects) {
    ks = select_list(KeyList{keys}, m, r, valid, 0u, kWarpBin, hist, cnt, sh, merged, cluster ? csize : 1u,
                     one_value_shift);
    whole_bin = ks.st.count == ks.st.krem;
    rank_bin = !whole_bin && ks.st.count <= kRankBin;
  } else {
    ks = pre;
    whole_bin = pre_mode == BinMode::kWhole;
    rank_bin = pre_mode == BinMode::kRank;
  }
  trace("selected");
  const uint32_t tie = ks.value_at_prefix();
  ListSelect cs{0u, SelectState{0u, 0u, 0u, 0u}};
  if (selects && !whole_bin && !rank_bin) {  // (the bin is the single key `tie`)
    const TieColumnList ties{keys, cols, tie};
    list_range(ties, m, cnt);
    if (cluster) {
      cluster_range(cnt, csize);
    }
    cs = select_list(ties, m, ks.st.krem, ks.st.count, 0u, 0u, hist, cnt, sh, merged, cluster ? csize : 1u);
  }
  // Each warp compacts the columns it takes into its own slots of `keys` (read already: warp w owns
  // keys[it * kThreads + 32 w + lane], and its j-th taken entry goes to the slot of row j / 32, lane
  // j % 32, never past the rows it has read), reserves its output positions with one atomic, and
  // writes them in converged, coalesced steps (a loop over each lane's own entries ran the warp's
  // steps about half full and scattered its stores).
  static_assert(kCapacity % kThreads == 0, "a warp's slots hold every entry it can take");
  const uint32_t lane = threadIdx.x & 31u;
  uint32_t* staged = keys + (threadIdx.x & ~31u);  // entry j at staged[(j / 32) * kThreads + j % 32]
  uint32_t n_taken = 0u;  // (warp-uniform)
  // (block-uniform) the threshold bin's entries are ranked or split by column, not taken whole
  const bool split_bin = !whole_bin && (selects || rank_bin);
  for (int it = 0; it * kThreads < m; ++it) {
    const int i = it * kThreads + int(threadIdx.x);
    const bool live = i < m;
    const uint32_t key = live ? keys[i] : 0u;
    const uint32_t d = (key - ks.base) & ks.st.mask;
    const bool in_bin = live && d == ks.st.prefix;
    bool take = live && (d > ks.st.prefix || (in_bin && whole_bin));
    // A split bin's entries (a few a row) in a branch the warp skips whole when it holds none (as
    // per-lane branches around every step: ~40 instructions an iteration, ~35 so; sm_90a, narrow shape).
    if (split_bin && __any_sync(0xFFFFFFFFu, in_bin)) {
      bool to_bin = false;
      int32_t col = 0;
      if (in_bin) {
        col = cols[i];
        to_bin = rank_bin;
        take = !rank_bin && cs.taken(~uint32_t(col));
      }
      if (to_bin) {  // the bin's entries to rank 0's list (<= kRankBin of them: one atomic each, no vote)
        const uint32_t p = remote ? radix::cluster_atomic_add(&cnt.nbin, 1u, 0u) : atomicAdd(&cnt.nbin, 1u);
        if (kGathered && rank != 0) {  // (p < kRankBin: the bin holds at most kRankBin entries)
          const uint32_t bar = radix::cluster_addr(&ex->gbar, 0u);
          radix::st_async(radix::cluster_addr(&cnt.bin_key[p], 0u), key, bar);
          radix::st_async(radix::cluster_addr(&cnt.bin_col[p], 0u), uint32_t(col), bar);
        } else if (p < kRankBin && cluster) {
          radix::cluster_store(&cnt.bin_key[p], key, 0u);
          radix::cluster_store(reinterpret_cast<uint32_t*>(&cnt.bin_col[p]), uint32_t(col), 0u);
        } else if (p < kRankBin) {
          cnt.bin_key[p] = key;
          cnt.bin_col[p] = col;
          if (kGathered) {
            atomicAdd(&cnt.before, 1u);
          }
        }
      }
    }
    const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, take);  // (every lane has read its key)
    if (take) {
      const uint32_t j = n_taken + uint32_t(__popc(ballot & lanemask_lt()));
      staged[(j >> 5) * kThreads + (j & 31u)] = uint32_t(cols[i]);
    }
    n_taken += uint32_t(__popc(ballot));
  }
  trace("f_take");
  uint32_t pos = 0u;
  if (lane == 0u && n_taken != 0u) {
    pos = remote ? radix::cluster_atomic_add(&cnt.out, n_taken, 0u) : lane_atomic_add(&cnt.out, n_taken, 0u);
  }
  pos = __shfl_sync(0xFFFFFFFFu, pos, 0);
  __syncwarp();  // the staged columns are visible to the whole warp
  if (kLookupsInFlight && o.mode == int32_t(TopkMode::kPageTable)) {  // (block-uniform)
    // A split row's warp takes ~16-32 entries (k / (CTAs * 16 warps)): one step, not four of which three
    // run idle (1x131072's form -0.14 us, ratio to topk 1.054 -> 1.042, H200).
    if (kGathered && n_taken <= 32u) {  // (warp-uniform)
      write_staged<1, true>(staged, n_taken, pos, o, k);
    } else {
      write_staged<4, true>(staged, n_taken, pos, o, k);
    }
  } else {
    write_staged<2, false>(staged, n_taken, pos, o, k);
  }
  trace("f_write");
  if (cluster) {
    radix::cluster_sync();  // every CTA's positions and bin entries are in rank 0; no remote access after
  }
  if (rank_bin && rank == 0) {
    __syncthreads();
    if constexpr (kGathered) {  // the other CTAs' entries of the bin (8 bytes each), gbar's phase 1 (0)
      if (threadIdx.x == 0) {
        radix::xbar_expect(&ex->gbar, 8u * (ks.st.count - cnt.before));
      }
      radix::xbar_wait(&ex->gbar, kPreselected ? 0u : 1u);
    }
    trace("r_entries");
    // Entry t's rank: the entries with a larger key, or an equal key and a smaller column. Only the
    // warps holding entries count; the loop is branch-free and unrolled so that a round's 2 * kRankUnroll
    // broadcast loads are all in flight before its compares (one load at a time, behind each compare and
    // branch, it took ~1.3 us of fp32 1x131072's rank 0 and ~5 us of bf16's, H200 phase stamps).
    const uint32_t nb = kGathered ? ks.st.count : cnt.nbin;
    if (threadIdx.x < ((nb + 31u) & ~31u)) {  // (whole warps; nb <= kRankBin)
      const uint32_t t = threadIdx.x;
      const uint32_t key = t < nb ? cnt.bin_key[t] : 0u;
      const int32_t col = t < nb ? cnt.bin_col[t] : 0;
      // A split row's page-table lookup, in flight while the entry is ranked (issued after the rank, it is
      // the row's last wait: the form's ratio to topk 1.074 -> 1.048 on 1x131072, 1.054 -> 1.045 on
      // 20x134868; H200).
      const int32_t rel = int32_t(int64_t(col) - o.start);
      constexpr bool kEarlyLookup = kLookupsInFlight && kGathered;  // (a split row's rank 0: the row's end)
      const bool lookup = kEarlyLookup && o.mode == int32_t(TopkMode::kPageTable);  // (block-uniform)
      const int32_t page = lookup ? o.page_of(rel, t < nb) : -1;
      uint32_t before = 0;
      for (uint32_t j0 = 0; j0 < nb; j0 += kRankUnroll) {  // (same j in every thread: broadcast reads)
        uint32_t kj[kRankUnroll];
        int32_t cj[kRankUnroll];
#pragma unroll
        for (uint32_t u = 0; u < kRankUnroll; ++u) {  // (j < kRankBin: nb rounded up stays in the arrays)
          kj[u] = cnt.bin_key[j0 + u];
          cj[u] = cnt.bin_col[j0 + u];
        }
#pragma unroll
        for (uint32_t u = 0; u < kRankUnroll; ++u) {  // (entries past nb are stale: masked)
          before += uint32_t((j0 + u < nb) & ((kj[u] > key) | ((kj[u] == key) & (cj[u] < col))));
        }
      }
      if constexpr (kEarlyLookup) {
        emit_mapped(t < nb && before < ks.st.krem, rel, lookup ? o.of_page(rel, page) : o.map(rel), o, &cnt.out, k);
      } else {
        emit(t < nb && before < ks.st.krem, col, o, &cnt.out, k);
      }
    }
    trace("r_ranked");
  }
  if (kGathered && csize > 1) {  // rank 0's cnt.out serves the others' reservations until they are done
    if (rank != 0) {
      radix::cluster_arrive_release();
    } else {
      radix::cluster_arrive_relaxed();
      radix::cluster_wait();
      trace("r_others");
    }
  }
}

// Samples taken from a window of n keys: 2048, doubled (up to kMaxSamples) until n <= 48 S, so that
// about 128 samples or more fall above the most the buffer should take (j_hi below): the threshold's
// relative error stays small.
constexpr int kMinSamples = 2048;
__device__ __forceinline__ int sample_count(int64_t n) {
  int s = kMinSamples;
  while (s < kMaxSamples && int64_t(s) * 48 < n) {
    s *= 2;
  }
  return s;
}

// Keys per sampled run: single keys spread over the row cost one DRAM access each (random
// accesses, the slowest pattern there is); runs of 16 consecutive keys read two 32-byte sectors. Runs of
// 32 made smooth rows (random walks) miss k often enough that a launch of 64 x 131072 such rows waited on
// one row's exact fallback (127 us against 22 us with runs of 16; H200).
constexpr int kSampleRun = 16;

// Sample i (of S, a multiple of kLoads * kThreads) to buf[i], in runs of kSampleRun keys starting
// step keys apart, with this thread's smallest and largest. kLoads loads in flight a thread, all issued
// before any is used and each unconditional: a bounds test and a key conversion a load put each load in
// its own branch, waited for before the next (8 round trips in turn at 4096 samples; 1x131072: 3.45 us
// from the kernel's start to the samples, H200). A thread's samples of a round sit kThreads apart:
// its offsets kThreads / kSampleRun runs apart. (At S = 2048, 4 loads a thread: 8 loaded 4 twice.)
template <typename T, int kLoads>
__device__ __forceinline__ void load_samples(const T* first, uint32_t step, int S, uint32_t* buf, uint32_t& v_lo,
                                             uint32_t& v_max, uint32_t nan_key) {
  static_assert(kThreads % kSampleRun == 0, "a round's samples are whole runs");
  const uint32_t run_step = uint32_t(kThreads / kSampleRun) * step;
  for (int base = 0; base < S; base += kLoads * kThreads) {
    const uint32_t o = (uint32_t(base / kSampleRun) + threadIdx.x / kSampleRun) * step + threadIdx.x % kSampleRun;
    uint32_t raw[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      raw[u] = radix::KeyOf<T>::raw(first + (o + uint32_t(u) * run_step));
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const uint32_t v = radix::KeyOf<T>::of_raw(raw[u], nan_key);
      buf[base + u * kThreads + int(threadIdx.x)] = v;
      v_lo = min(v_lo, v);
      v_max = max(v_max, v);
    }
  }
}

// A threshold E such that, with high probability, at least k and at most the buffer's keys of the
// window are >= E: E is (close to) the j-th largest of S samples (evenly spaced runs of kSampleRun
// consecutive keys). Uses `buf` (S words) and `hist`. Ends with a barrier, after which every thread may read
// cnt.runs (written next by the next call, many barriers later). Needs n > kCapacity.
// `promising` says whether the expected count of keys >= E fits the candidate buffer (a plateau at E,
// e.g. relu zeros, puts most of the window at E: the filter pass would overflow), and `single`
// whether E is the one value of its bin (the j-th largest sample exactly: a plateau's value).
template <typename T>
__device__ __forceinline__ uint32_t sample_threshold(const T* row, int64_t lo, int64_t n, uint32_t k,
                                                     uint32_t* buf, uint32_t* hist, Counters& cnt,
                                                     SelectShared& sh, bool wide, bool& promising, bool& single,
                                                     uint32_t pf_bytes, bool spread, uint32_t csize, uint32_t rank,
                                                     uint32_t nan_key) {
  // A spread row takes the samples of a window half as long: every CTA of it loads and selects the
  // same ones, and its candidates have 4 buffers or more (1x131072 10.6 -> 10.2 us, 20x134868 13.6 ->
  // 12.95; H200; tests/test_topk_filter_model.py checks that they fit).
  const int S = sample_count(spread ? n / 2 : n);
  const int log2_runs = 31 - __clz(S / kSampleRun);
  // j0 samples are expected among the top k. Aim 4 standard deviations above it (fewer than k
  // candidates costs the row the exact fallback; each candidate past k costs the finish, about a third
  // of the row's instructions at 32K keys). Aiming at the middle of j0 and j_hi, the most the buffer
  // should take, cost 5% at 32K keys, 2.5% at 64K (H200). (Approximate division and
  // root: an aim, not a bound; IEEE ones are ~10 instructions each in every warp.)
  const float j0 = __fdividef(float(S) * float(k), float(n));
  const float j_hi = __fdividef(float(S) * (0.75f * float(kCapacity)), float(n));
  uint32_t j = uint32_t(j0 + 4.0f * (j0 * rsqrtf(j0)) + 2.0f);  // (j0 > 0: S >= 2048, k >= 1, n < 2^31)
  if (wide) {  // (a retry after too few candidates) most of what the buffer takes: 0.85 of j_hi keeps
    j = max(uint32_t(0.85f * j_hi), j);  // the select's slack (j / 8 + 1) under j_hi, so still promising
  }
  j = j > uint32_t(S) ? uint32_t(S) : j;
  uint32_t v_lo = 0xFFFFFFFFu;  // this thread's smallest sample (cnt.lo / cnt.hi were reset, with a barrier since)
  uint32_t v_max = 0u;  // this thread's largest sample (every thread holds one at least: S >= kThreads)
  // Run r starts at r * step (32-bit offsets: windows hold fewer than 2^31 keys); the last run ends
  // at most at n - 1.
  const uint32_t step = uint32_t((n - kSampleRun) >> log2_runs);
  static_assert(kMinSamples % (4 * kThreads) == 0 && (2 * kMinSamples) % (8 * kThreads) == 0,
                "S is a whole number of rounds of loads");
  if (S == kMinSamples) {
    load_samples<T, kMinSamples / kThreads>(row + lo, step, S, buf, v_lo, v_max, nan_key);
  } else {
    load_samples<T, 8>(row + lo, step, S, buf, v_lo, v_max, nan_key);
  }
  trace("s_loaded");
  {  // the first pf_bytes of this CTA's vectors (FilterStages) into L2 while the samples are selected
    const char* pf = reinterpret_cast<const char*>(row + lo);
    if (csize == 1u) {  // (in bounds: pf_bytes is at most the window's)
      for (uint32_t off = threadIdx.x * 128u; off < pf_bytes; off += kThreads * 128u) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(pf + off));
      }
    } else {  // a split row's chunks of kChunkVecs vectors, dealt to the CTAs in turn: 4 lines each
      static_assert(kChunkVecs * 16 == 4 * 128, "a chunk is 4 lines of 128 bytes");
      const uint64_t window_bytes = uint64_t(n) * sizeof(T);
      for (uint32_t line = threadIdx.x; line * 128u < pf_bytes; line += kThreads) {
        const uint64_t off = (uint64_t(line / 4u) * csize + rank) * 512u + (line % 4u) * 128u;
        if (off < window_bytes) {
          asm volatile("prefetch.global.L2 [%0];" ::"l"(pf + off));
        }
      }
    }
  }
  // A bound below the j-th largest sample, so that the select's first level spans [bound, largest]
  // only: the smallest of the maxima of G >= j groups of samples (G distinct samples lie at or above
  // it). The samples' whole range put a normal row's top 100 of 4096 samples in a few of the 2048
  // bins: a second level. Groups: g aligned lanes (g a power of two, at most a warp), G = kThreads / g.
  const uint32_t g = j <= uint32_t(kThreads) ? min(32u, 1u << (31 - __clz(uint32_t(kThreads) / j))) : 1u;
  for (uint32_t o = 1; o < g; o *= 2) {  // (warp-uniform)
    v_max = max(v_max, __shfl_xor_sync(0xFFFFFFFFu, v_max, o));
  }
  const uint32_t v_hi = __reduce_max_sync(0xFFFFFFFFu, v_max);  // the warp's largest sample
  // (j > kThreads: no bound, the smallest. Below the largest by one at least: when the bound is the
  // largest sample, the select still counts the samples equal to it.)
  const uint32_t bound = j <= uint32_t(kThreads) ? min(v_max, v_hi == 0u ? 0u : v_hi - 1u) : v_lo;
  range_add(bound, v_hi, cnt);
  v_lo = __reduce_min_sync(0xFFFFFFFFu, v_lo);
  if ((threadIdx.x & 31) == 0) {
    atomicMin(&cnt.lo_all, v_lo);
  }
  if (threadIdx.x == 0) {
    cnt.runs = 0u;  // (before the barrier below)
  }
  __syncthreads();  // the samples are in place
  trace("sampled");
  // Close enough to j: samples at or above the bin's lower edge at most j + j / 8 + 1.
  ListSelect sel = select_list(KeysFromList{buf, cnt.lo}, S, j, uint32_t(S), j / 8 + 1, 0u, hist, cnt, sh);
  trace("s_select");
  // Smooth rows (neighbouring keys alike): the samples at or above the threshold crowd into a few runs,
  // so their count varies as a count of runs, far more than 4 sigma of independent samples covers.
  // When fewer than half the runs expected of independent samples hold one, aim at the middle.
  const uint32_t E = sel.value_at_prefix();
  uint32_t hits = 0;  // (a warp reads 32 / kSampleRun whole runs a step)
  static_assert(32 % kSampleRun == 0 && kMinSamples % kThreads == 0, "a warp step reads whole runs");
  constexpr uint32_t kRunBits = kSampleRun == 32 ? 0xFFFFFFFFu : (1u << kSampleRun) - 1u;
  for (int i = int(threadIdx.x); i < S; i += kThreads) {
    const uint32_t b = __ballot_sync(0xFFFFFFFFu, buf[i] >= E);
#pragma unroll
    for (int r = 0; r < 32; r += kSampleRun) {
      hits += ((b >> r) & kRunBits) != 0u ? 1u : 0u;
    }
  }
  if ((threadIdx.x & 31) == 0) {
    lane_atomic_add(&cnt.runs, hits, 0u);
  }
  if (threadIdx.x == 0) {
    cnt.lo = cnt.lo_all;  // (the select below, if any, spans every sample: j_mid may exceed G)
  }
  __syncthreads();
  const float p = __fdividef(float((j - sel.st.krem) + sel.st.count), float(S));
  const float expected_hits = float(S / kSampleRun) * (1.0f - __powf(1.0f - p, float(kSampleRun)));
  const uint32_t j_mid = min(uint32_t(0.5f * (j0 + j_hi)), uint32_t(S));
  if (!wide && float(cnt.runs) < 0.5f * expected_hits && j_mid > j) {  // (block-uniform)
    j = j_mid;
    sel = select_list(KeyList{buf}, S, j, uint32_t(S), j / 8 + 1, 0u, hist, cnt, sh);
  }
  const uint32_t at_or_above = (j - sel.st.krem) + sel.st.count;
  // (at_or_above * n / S <= 0.75 kCapacity, in exact integers)
  promising = uint64_t(at_or_above) * uint64_t(n) * 4u <= uint64_t(3u * uint32_t(kCapacity)) * uint64_t(S);
  single = sel.st.mask == 0xFFFFFFFFu;
  return sel.value_at_prefix();  // the lower edge of the bin (its unfixed offset bits are 0)
}

// 16-byte asynchronous copy global -> shared (L2 only), and its commit / wait. Each thread later
// reads back only what it copied itself, so the per-thread wait is enough (no barrier).
__device__ __forceinline__ void cp_async16(uint4* dst, const void* src) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// The filter compares scores as floats (one instruction a key) with the float of the key E:
// x >= e  <=>  key(x) >= E for every non-NaN x (-0.0 == +0.0 as keys and as floats). NaN's key 0
// passes only when E == 0, where the filter takes every key without comparing. E below -inf's key:
// every non-NaN passes (e = -inf); E above +inf's key: nothing passes (e = NaN).
// nan_first (NaN's key 0xFFFFFFFF, at or above every E): the unordered compare !(x < e), which NaN
// passes, and e = +inf above +inf's key, so that key range passes NaN and +inf: a superset of the keys
// >= E, which the finish selects from by key (the plateau path, which cannot take one, does not get
// such an E: filter_row).
// kUnordered is a template argument, not a runtime flag: a select in the per-key compare cost the fp32
// filter 3-8% (H200, 4096 x 32768: 197.3 -> 213.4 us; 16384 x 65536: 1231.1 -> 1320.9).
template <bool kUnordered>
struct FloatThreshold {
  float e;
  __device__ __forceinline__ explicit FloatThreshold(uint32_t E) {
    if (E <= 0x007FFFFFu) {
      e = -__int_as_float(0x7F800000);
    } else if (E > 0xFF800000u) {
      e = kUnordered ? __int_as_float(0x7F800000) : __int_as_float(0x7FC00000);
    } else {
      e = __uint_as_float((E & 0x80000000u) ? (E & 0x7FFFFFFFu) : ~E);
    }
  }
  // For E != 0. nan_last: NaN fails the compare (its key 0 < E); nan_first: it passes.
  __device__ __forceinline__ uint32_t pass(float x) const { return uint32_t(kUnordered ? !(x < e) : x >= e); }
};

// Bit j: item j of the raw 16-byte vector passes (E != 0).
template <typename T, typename Threshold>
__device__ __forceinline__ uint32_t pass_bits(const uint4& x, const Threshold& t) {
  if constexpr (sizeof(T) == 4) {
    return t.pass(__uint_as_float(x.x)) | (t.pass(__uint_as_float(x.y)) << 1) |
           (t.pass(__uint_as_float(x.z)) << 2) | (t.pass(__uint_as_float(x.w)) << 3);
  } else {
    const uint32_t w[4] = {x.x, x.y, x.z, x.w};
    uint32_t p = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        p |= t.pass(__uint_as_float(w[q] << 16)) << (2 * q);
        p |= t.pass(__uint_as_float(w[q] & 0xFFFF0000u)) << (2 * q + 1);
      } else {
        p |= t.pass(radix::fp16_bits_to_float(w[q] & 0xFFFFu)) << (2 * q);
        p |= t.pass(radix::fp16_bits_to_float(w[q] >> 16)) << (2 * q + 1);
      }
    }
    return p;
  }
}

// Item j of a raw 16-byte vector of T, as its bits (16-bit types: zero-extended).
// (j is a constant after unrolling: no dynamic register indexing.)
template <typename T>
__device__ __forceinline__ uint32_t raw_item(const uint4& x, int j) {
  const int word = j * int(sizeof(T)) / 4;
  const uint32_t w = word == 0 ? x.x : word == 1 ? x.y : word == 2 ? x.z : x.w;
  return sizeof(T) == 4 ? w : (j & 1) ? (w >> 16) : (w & 0xFFFFu);
}


// 16-byte vectors per thread per round: 16 keys for fp32 (four vectors), 16 for 16-bit types (two
// vectors: bf16 4096x32768 400 -> 375 us against one vector, H200).
// The round's candidates are stored unconverted (raw bits: only the few that pass pay for the key),
// and `raw_to_keys` converts the buffer after.
template <typename T>
__host__ __device__ constexpr int round_vecs() {
  return sizeof(T) == 4 ? 4 : 2;
}

// The window's vectors [vf, ve) lie wholly inside it and are copied ahead through `stage`; the (at
// most two) partial ones are read apart, in place (nothing outside the window is read).
// Which vectors this CTA filters: all of them, stage s holding vectors s * kThreads + threadIdx.x; or
// (kInterleaved, a split row) chunks of kChunkVecs, one a warp, dealt to the cluster's CTAs in turn:
// warp w's vector of stage s is in chunk (s * kThreads / 32 + w) * csize + rank. Contiguous parts put
// a smooth row's top keys in one CTA (random walks of 131072 keys, 8 CTAs: the busiest CTA held
// 2027-4188 candidates, 481-948 with chunks of 128 fp32 keys; CPU model).
template <typename T, bool kInterleaved>
struct FilterStages {
  const uint4* src;
  int32_t vf;
  int32_t ve;
  uint4* stage;
  int32_t first;   // (kInterleaved) this thread's vector of stage 0
  int32_t stride;  // (kInterleaved) from its vector of one stage to the next
  __device__ __forceinline__ FilterStages(const GlobalSrc<T>& g, uint4* stage_, uint32_t csize, uint32_t rank)
      : src(reinterpret_cast<const uint4*>(g.row + g.a0)),
        vf(g.a0 == g.lo ? 0 : 1),
        ve(int32_t((g.hi - g.a0) / GlobalSrc<T>::kItems)),
        stage(stage_),
        first(int32_t(((threadIdx.x / 32u) * csize + rank) * kChunkVecs + threadIdx.x % 32u)),
        stride(kThreads * int32_t(csize)) {}
  // The vector of stage s of thread tid (threadIdx.x); a stage's vectors lie below (s + 1) * step().
  __device__ __forceinline__ int32_t vec(int32_t s, int tid) const {
    if constexpr (kInterleaved) {
      return first + s * stride;
    } else {
      return s * kThreads + tid;
    }
  }
  __device__ __forceinline__ int32_t step() const { return kInterleaved ? stride : kThreads; }
  // Copy the thread's vector of stage s into its slot; one commit group per stage, empty or not
  // (the waits count groups). kChecked: the vector may lie outside [vf, ve).
  template <bool kChecked>
  __device__ __forceinline__ void issue(int32_t s) const {
    const int32_t v = vec(s, int(threadIdx.x));
    if (!kChecked || (v >= vf && v < ve)) {
      cp_async16(stage + (uint32_t(s) % kStages) * kThreads + threadIdx.x, src + v);
    }
    cp_async_commit();
  }
};

// Append the passing items (bit h * I + j of `pass`: item j of x[h], column col0 + h * col_step + j)
// as raw bits to the candidates (past kCapacity: counted, not stored). The warp must be converged.
template <typename T, int R>
__device__ __forceinline__ void append(uint32_t pass, const uint4 (&x)[R], int32_t col0, int32_t col_step,
                                       uint32_t* keys, int32_t* cols, Counters& cnt) {
  constexpr int I = GlobalSrc<T>::kItems;
  const uint32_t n = uint32_t(__popc(pass));
  if (__ballot_sync(0xFFFFFFFFu, n != 0u) == 0u) {
    return;  // (warp-uniform)
  }
  uint32_t pos = reserve_some(n, &cnt.cand);
  if (pos + n > uint32_t(kCapacity)) {
    pass = 0u;  // overflow: counted, not stored (the row takes the exact fallback)
  }
  // (one moving pointer: one add a stored item; the column sits kCapacity words after its key)
  uint32_t* kp = keys + pos;
#pragma unroll
  for (int h = 0; h < R; ++h) {
#pragma unroll
    for (int j = 0; j < I; ++j) {
      if ((pass >> (h * I + j)) & 1u) {
        kp[0] = raw_item<T>(x[h], j);
        kp[kCapacity] = uint32_t(col0 + h * col_step + j);
        ++kp;
      }
    }
  }
}

// One round of the filter pass: the thread's R vectors of stages s0 .. s0 + R - 1 compared with the
// threshold (every item taken: kTakeAll), the next R stages issued, the passing items appended.
// kChecked: some vector of the round, or of the stages it issues, may lie outside [vf, ve) (the
// first round and the last ones); the rounds between skip the bounds tests.
template <typename T, bool kTakeAll, bool kChecked, bool kInterleaved, typename Threshold>
__device__ __forceinline__ void filter_round(const FilterStages<T, kInterleaved>& fs, int32_t s0,
                                             const Threshold& t, int32_t a0, uint32_t* keys, int32_t* cols,
                                             Counters& cnt) {
  constexpr int I = GlobalSrc<T>::kItems;
  constexpr int R = round_vecs<T>();
  const int tid = int(threadIdx.x);
  cp_async_wait<kStages - R>();  // stages s0 .. s0 + R - 1 have landed
  uint4 x[R];
  uint32_t pass = 0u;
#pragma unroll
  for (int h = 0; h < R; ++h) {
    const int32_t v = fs.vec(s0 + h, tid);
    const bool in = !kChecked || (v >= fs.vf && v < fs.ve);
    x[h] = in ? fs.stage[(uint32_t(s0 + h) % kStages) * kThreads + tid] : make_uint4(0u, 0u, 0u, 0u);
    const uint32_t m = in ? (1u << I) - 1u : 0u;
    pass |= (kTakeAll ? m : m & pass_bits<T>(x[h], t)) << (h * I);
  }
#pragma unroll
  for (int h = 0; h < R; ++h) {
    fs.template issue<kChecked>(s0 + kStages + h);  // the slot is free: its vector is in registers
  }
  append<T, R>(pass, x, a0 + fs.vec(s0, tid) * I, fs.step() * I, keys, cols, cnt);
}

// Append every key >= E of this CTA's vectors of the window (every key: kTakeAll, E == 0), with its
// column, to the candidates, as raw bits (keys past kCapacity are counted in cnt.cand, not stored).
// round_vecs 16-byte vectors per thread per round, loaded kStages vectors ahead through the thread's
// own slots of `stage` (cp.async): the loads never wait for the compare-and-append work.
template <typename T, bool kTakeAll, bool kInterleaved, bool kUnordered>
__device__ __forceinline__ void filter_pass_as(const GlobalSrc<T>& g, uint4* stage_buf, uint32_t E, uint32_t* keys,
                                               int32_t* cols, Counters& cnt, uint32_t csize, uint32_t rank) {
  constexpr int I = GlobalSrc<T>::kItems;
  constexpr int R = round_vecs<T>();
  static_assert(kStages % R == 0, "a round's vectors are whole stages");
  const FloatThreshold<kUnordered> t(E);
  const FilterStages<T, kInterleaved> fs(g, stage_buf, csize, rank);
  const int32_t a0 = int32_t(g.a0);
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    fs.template issue<true>(s);
  }
  const int32_t rounds = vec_rounds(g, fs.step());
  for (int32_t s0 = 0; s0 < rounds; s0 += R) {
    // (block-uniform) every vector the round reads or issues lies inside [vf, ve)
    // (the step written out: through step() here the one-CTA kernels' loop compiled otherwise)
    if ((s0 > 0 || fs.vf == 0) && (s0 + kStages + R) * (kInterleaved ? fs.stride : kThreads) <= fs.ve) {
      filter_round<T, kTakeAll, false>(fs, s0, t, a0, keys, cols, cnt);
    } else {
      filter_round<T, kTakeAll, true>(fs, s0, t, a0, keys, cols, cnt);
    }
  }
  // The partial vectors, warp 0 (of rank 0), a lane each: the first when the window starts inside a
  // vector, the last when it ends inside one (one vector when the window lies inside it).
  if (threadIdx.x < 32 && (!kInterleaved || rank == 0)) {
    const int lane = int(threadIdx.x);
    int32_t v = -1;
    if (lane == 0 && fs.vf == 1) {
      v = 0;
    } else if (lane == 1 && fs.ve < g.vecs && fs.ve >= fs.vf) {
      v = fs.ve;
    }
    uint4 x[1] = {make_uint4(0u, 0u, 0u, 0u)};
    uint32_t m = 0u;
    if (v >= 0) {
      alignas(16) T part[I];
#pragma unroll
      for (int j = 0; j < I; ++j) {
        const int64_t i = g.a0 + int64_t(v) * I + j;
        const bool in = i >= g.lo && i < g.hi;
        part[j] = in ? g.row[i] : T();
        m |= uint32_t(in) << j;
      }
      x[0] = *reinterpret_cast<const uint4*>(part);
    }
    append<T, 1>(kTakeAll ? m : m & pass_bits<T>(x[0], t), x, a0 + (v < 0 ? 0 : v) * I, 0, keys, cols, cnt);
  }
  cp_async_wait<0>();  // no copy may land after the buffer is reused
}

template <typename T, bool kInterleaved>
__device__ __forceinline__ void filter_pass(const GlobalSrc<T>& g, uint4* stage_buf, uint32_t E, uint32_t* keys,
                                            int32_t* cols, Counters& cnt, uint32_t csize, uint32_t rank) {
  if (E == 0u) {
    filter_pass_as<T, true, kInterleaved, false>(g, stage_buf, E, keys, cols, cnt, csize, rank);
  } else if (g.nan_key != 0u) {  // nan_first: the unordered compare (NaN passes)
    filter_pass_as<T, false, kInterleaved, true>(g, stage_buf, E, keys, cols, cnt, csize, rank);
  } else {
    filter_pass_as<T, false, kInterleaved, false>(g, stage_buf, E, keys, cols, cnt, csize, rank);
  }
}

// The filter's raw candidates (the first min(m, kCapacity)) to keys, in place, and their range
// into cnt.lo / cnt.hi (reset, with a barrier since).
// kBinned, slot != nullptr (a one-round row: a spread split row's, kBits 8, or a one-CTA row's, kBits 11):
// each candidate also counted in its bin there.
template <typename T, bool kBinned = false, int kBits = kOneRoundBits>
__device__ __forceinline__ void raw_to_keys(uint32_t* keys, uint32_t m, uint32_t nan_key, Counters& cnt,
                                            uint32_t* slot = nullptr,
                                            OneRoundBins<kBits> bins = OneRoundBins<kBits>(0u, 0u)) {
  m = m < uint32_t(kCapacity) ? m : uint32_t(kCapacity);
  uint32_t lo = 0xFFFFFFFFu;
  uint32_t hi = 0u;
  for (uint32_t base = 0; base < m; base += kThreads) {  // (uniform trip count: range_add votes)
    const uint32_t i = base + threadIdx.x;
    if (i < m) {
      const uint32_t key = radix::KeyOf<T>::of_raw(keys[i], nan_key);
      keys[i] = key;
      lo = min(lo, key);
      hi = max(hi, key);
      if (kBinned && slot != nullptr) {
        atomicAdd(slot + bins.bin(key), 1u);
      }
    }
  }
  range_add(lo, hi, cnt);
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
// Stops once it has them; returns how many it found (at least `need` unless the window holds fewer).
// Ends with a barrier.
template <typename T>
__device__ __forceinline__ uint32_t ordered_ties(const GlobalSrc<T>& g, uint32_t tie, uint32_t need, uint32_t pos0,
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
  return run;
}

// One level of the exact path over device memory: the histogram of the keys equal to the prefix
// (under the mask), plus each bin's OR and AND of its keys. 8 keys per thread per round (16 spill at
// 64 registers).
template <typename T>
__device__ __forceinline__ void level_pass(const GlobalSrc<T>& g, const SelectState& st, int shift, uint32_t* hist,
                                           uint32_t* bin_or, uint32_t* bin_and) {
  constexpr int U = GlobalSrc<T>::kItems == 4 ? 2 : 1;
  hist_pass<GlobalSrc<T>, BinOrAnd, U>(g, st, shift, hist, BinOrAnd{bin_or, bin_and});
}

// The exact fallback over the whole window, one CTA. Nothing of the row has been written.
template <typename T, bool kLookupsInFlight>
__device__ __forceinline__ void exact_row(const GlobalSrc<T>& g, uint32_t n, uint32_t k, uint32_t* keys,
                                          int32_t* cols, uint32_t* hist, Counters& cnt, const RowOut& o,
                                          SelectShared& sh) {
  SelectState st{0u, 0u, k, n};
  // Per bin, the OR and the AND of its keys (in the candidate buffer, free until the gather): when
  // they agree the bin holds one value (a plateau) and the remaining levels are skipped.
  uint32_t* bin_or = keys;
  uint32_t* bin_and = keys + radix::kBins;
  for (int level = 0; level < radix::kLevels; ++level) {
    for (int b = threadIdx.x; b < radix::kBins; b += blockDim.x) {
      hist[b] = 0u;
      bin_or[b] = 0u;
      bin_and[b] = 0xFFFFFFFFu;
    }
    __syncthreads();
    level_pass(g, st, radix::level_shift(level), hist, bin_or, bin_and);
    __syncthreads();
    radix::refine(hist, level, st, sh);
    if (st.count == st.krem || st.count <= uint32_t(kCapacity)) {
      break;
    }
    const uint32_t one = bin_or[sh.bin];
    const bool plateau = one == bin_and[sh.bin];
    __syncthreads();  // everyone read bin_or / bin_and before the next level resets them
    if (plateau) {  // every key of the bin is `one`: it is the k-th largest
      st.prefix = one;
      st.mask = 0xFFFFFFFFu;
      break;
    }
  }
  __syncthreads();  // everyone read bin_or / bin_and before the gather overwrites them
  const bool take_bin = st.count == st.krem;
  const bool gather = !take_bin && st.count <= uint32_t(kCapacity);
  if (threadIdx.x == 0) {
    cnt.cand = 0u;
  }
  __syncthreads();
  gather_pass(g, st, gather, take_bin, keys, cols, cnt, o, k);
  __syncthreads();
  if (gather) {
    list_range(KeyList{keys}, int(st.count), cnt);
    finish<kLookupsInFlight>(keys, cols, int(st.count), st.krem, o, hist, cnt, k, sh, one_value_shift<T>());
  } else if (!take_bin) {  // more than kCapacity keys equal the k-th largest: the first ones win
    ordered_ties(g, st.prefix, st.krem, k - st.krem, o, k, sh);
  }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
constexpr bool kLateSplitRowOut = true;
#else
constexpr bool kLateSplitRowOut = false;
#endif

// A CTA's share of a window of n keys cut in csize, rounded up to 16 keys and at most n: the bound of
// the head each CTA asks L2 for (a split row's CTAs filter chunks dealt in turn, FilterStages).
__device__ __forceinline__ uint32_t cta_share(uint32_t n, uint32_t csize) {
  return min(((n + csize - 1u) / csize + 15u) & ~15u, n);  // (n < 2^31, csize <= 8: no wrap)
}

// Whether the page-table form's writes have their lookups in flight (finish): not in the split kernel's
// 16-bit instances, which then spill on sm_90a.
template <typename T, bool kSplit>
__host__ __device__ constexpr bool lookups_in_flight() {
  return !kSplit || sizeof(T) == 4;
}

// One row: one CTA of its cluster (kSplit), or the whole row.
template <typename T, bool kSplit>
__device__ __forceinline__ void filter_row(const KernelArgs& a, SelectShared& sh, Counters& cnt, uint4* dyn_smem,
                                           Exchange* ex) {
  static_assert(!(kHistInStage && kSplit), "a split row's summed histograms use the stage buffer");
  uint32_t* keys = reinterpret_cast<uint32_t*>(dyn_smem) + (kHistInStage ? 0 : radix::kBins);
  int32_t* cols = reinterpret_cast<int32_t*>(keys + kCapacity);
  uint4* stage = reinterpret_cast<uint4*>(cols + kCapacity);
  uint32_t* hist = kHistInStage ? reinterpret_cast<uint32_t*>(stage) : reinterpret_cast<uint32_t*>(dyn_smem);

  const uint32_t csize = kSplit ? uint32_t(a.cluster) : 1u;
  const int64_t r = kSplit ? radix::cluster_id_x() : blockIdx.x;  // (the split kernel: a cluster a row)
  const uint32_t rank = kSplit ? radix::cluster_rank() : 0u;
  const Window w = row_window(a, r);
  const uint32_t n = uint32_t(w.hi - w.lo);
  const uint32_t k = uint32_t(a.k);
  // A split row's finish is spread over its CTAs (one_round_select or hist_select, each CTA writing its
  // own) from kSpreadFinishMinCluster CTAs up.
  const bool spread = kSplit && csize >= uint32_t(topk_heuristics::kSpreadFinishMinCluster);
  // The row's RowOut: made once here, or, for a split row on sm_10x, where it is used (the choice
  // without spills at 64 registers on each arch).
  const RowOut row_o = kSplit && kLateSplitRowOut ? RowOut{} : row_out(a, r, w.start);
  const auto out_of_row = [&]() { return kSplit && kLateSplitRowOut ? row_out(a, r, w.start) : row_o; };

  if (n <= k) {  // short window: its indices, then -1 (no shared memory of another CTA is touched)
    const RowOut o = out_of_row();
    for (int64_t j = int64_t(rank) * blockDim.x + threadIdx.x; j < a.k; j += int64_t(csize) * blockDim.x) {
      if (j < n) {
        o.put(uint32_t(j), w.lo + j);
      } else {
        o.put_none(uint32_t(j));
      }
    }
    return;
  }

  // The row's pointer, taken anew from the arguments at each use (live across the sampled path's two
  // attempts, it spills at 64 registers).
  const auto row_of = [&]() { return static_cast<const T*>(a.scores) + r * a.row_stride; };
  if (threadIdx.x == 0) {
    cnt.cand = 0u;
    cnt.out = 0u;
    cnt.nbin = 0u;  // (a split row's finish: before the cluster barriers that follow the filter pass)
    cnt.retried = 0u;
    if constexpr (kSplit) {
      radix::xbar_init(&ex->xbar[0]);
      radix::xbar_init(&ex->xbar[1]);
      radix::xbar_init(&ex->gbar);
      radix::xbar_init(&ex->hbar[0]);
      radix::xbar_init(&ex->hbar[1]);
    }
  }
  range_reset(cnt);
  __syncthreads();
  // The fast path needs the sampled 2k..4k keys to fit the buffer with room to spare.
  const bool fits = n <= uint32_t(kCapacity);
  const bool fast = fits || (a.sample != 0 && kFastRatio * uint64_t(k) <= uint64_t(kCapacity));
  if (fast) {
    // A second attempt when the first left every candidate in the buffer but fewer than k of them:
    // sampled again at a wider aim, a fraction of the exact fallback's passes (smooth rows miss so).
    // (The attempt is kept in shared memory, the part and the row pointer recomputed: live across the
    // loop, they spill.)
    for (;;) {
      const bool wide = cnt.retried != 0u;
      bool promising = true;
      bool single = false;
      const T* row_a = static_cast<const T*>(a.scores) + r * a.row_stride;  // (row_of(), written out: fewer spills)
      const uint32_t pf_bytes =
          wide ? 0u : min(cta_share(n, csize), uint32_t(a.prefetch_bytes) / uint32_t(sizeof(T))) * uint32_t(sizeof(T));
      uint32_t E = fits ? 0u
                        : sample_threshold(row_a, w.lo, int64_t(n), k, keys, hist, cnt, sh, wide, promising, single,
                                           pf_bytes, spread, csize, rank, a.nan_key);
      // nan_first: a plateau at +inf or NaN (V >= +inf's key) would filter the keys above V with a
      // threshold above +inf's key, which FloatThreshold widens to pass V's keys too: the exact fallback.
      if (a.nan_key != 0u && !promising && E >= kInfKey) {
        single = false;
      }
      // A spread row's first sampled attempt off a plateau bins its candidates as it converts them and
      // sends the bins with its count (one_round_select). (Uniform over the row's CTAs: same samples.)
      // A one-CTA row does so too (fp32 4096x32768 -3.1%, bf16 -3.4%; H200) unless the
      // samples reach +inf (its finite candidates would crowd the lowest bins, every atomic on a few
      // words) or E is a plateau's value (`single`: ties 4096x32768 +5.1%, thousands of atomics on one).
      const uint32_t smax = cnt.hi;  // (sample_threshold's range: the samples' largest key)
      // (E above +inf's key, nan_first only: candidates below E, which the bins do not take.)
      const bool one_round =
          (kSplit ? spread && E <= kInfKey : smax < kInfKey && !single) && !wide && !fits && promising;
      if constexpr (kSplit) {
        if (!wide && threadIdx.x == 0) {
          ex->smax = smax;
        }
      } else if (threadIdx.x == 0) {
        cnt.before = smax;  // (a split row's field, free in a one-CTA row: no register held across the filter pass)
      }
      if (one_round && !kHistInStage) {
        radix::clear_hist_block<kThreads>(hist);  // the bins (the other rows' selects clear their own)
      }
      __syncthreads();  // the samples are dead; every thread has read their range
      range_reset(cnt);  // for the candidates' range (ordered before raw_to_keys by the filter pass's barrier)
      if constexpr (kSplit) {
        if (!wide) {
          // This CTA's barriers are set and its histogram is free: the other CTAs may push into it once
          // they have waited for this (before their count exchange).
          radix::cluster_arrive_relaxed();
        }
      }
      // Uniform over the row's CTAs (same samples, same decisions).
      if (!promising && !single) {  // (the sample missed) the exact fallback below, on rank 0
        if (rank != 0) {
          return;
        }
      } else {
        // A plateau at the sampled value V = E (relu zeros, heavy ties): filter the keys above V only;
        // when fewer than k, the first keys equal to V in index order complete the row.
        const bool plateau = !promising;
        const uint32_t V = E;
        E += plateau ? 1u : 0u;  // (V < the largest key, +inf's, so no wrap)
        trace("threshold");
        {
          GlobalSrc<T> g;  // the whole window (a split row: its CTA's chunks of it)
          g.init(static_cast<const T*>(a.scores) + r * a.row_stride, w.lo, w.hi, a.nan_key);
          filter_pass<T, kSplit>(g, stage, E, keys, cols, cnt, csize, rank);
        }
        __syncthreads();  // the candidates and their count are complete
        if (kHistInStage && one_round) {  // (the stages are free now)
          radix::clear_hist_block<kThreads>(hist);
          __syncthreads();
        }
        if constexpr (kSplit) {
          // (OneRoundBins made here and again at one_round_select, from V and ex->smax: held across
          // the count exchange it would take registers)
          raw_to_keys<T, true>(keys, cnt.cand, a.nan_key, cnt, one_round ? hist + rank * kOneRoundBins : nullptr,
                               OneRoundBins<>(V, ex->smax));
        } else {
          raw_to_keys<T, true, kRowRoundBits>(keys, cnt.cand, a.nan_key, cnt, one_round ? hist : nullptr,
                                              OneRoundBins<kRowRoundBits>(V, cnt.before));
        }
        trace("filtered");
        // cnt.total: the row's candidates when every CTA's fit its buffer and, unless at a plateau, the
        // row has at least k; else ~0 (the exact fallback). (Kept in shared memory: in registers across
        // the finish it spills.)
        if constexpr (kSplit) {
          // Every CTA's count and range to every CTA (st_async: no cluster barrier), then the same
          // decisions everywhere.
          const uint32_t attempt = wide ? 1u : 0u;
          if (!wide) {
            radix::cluster_wait();  // every CTA's barriers are initialised
          }
          if (threadIdx.x == 0) {
            radix::xbar_expect(&ex->xbar[attempt],
                               (csize - 1u) * (uint32_t(sizeof(uint4)) + (one_round ? kOneRoundBins * 4u : 0u)));
          }
          if (spread && !one_round) {
            radix::clear_hist_block<kThreads>(hist);  // for hist_select (the sample select is done with it)
          }
          __syncthreads();  // this CTA's count, range (and bins) are complete
          if (threadIdx.x < csize) {
            const uint4 mine = make_uint4(cnt.cand, cnt.lo, cnt.hi, 0u);
            if (threadIdx.x == rank) {
              ex->xs[attempt][rank] = mine;
            } else {
              radix::st_async(&ex->xs[attempt][rank], mine, threadIdx.x, &ex->xbar[attempt]);
            }
          }
          if (one_round) {  // this CTA's bins to its slot in every other CTA: a 16-byte vector a thread
            constexpr uint32_t kVecs = kOneRoundBins / 4u;
            for (uint32_t q = threadIdx.x; q < (csize - 1u) * kVecs; q += kThreads) {
              const uint32_t p = q / kVecs;
              uint4* at = reinterpret_cast<uint4*>(hist + rank * kOneRoundBins) + q % kVecs;
              radix::st_async(at, *at, p < rank ? p : p + 1u, &ex->xbar[attempt]);
            }
          }
          radix::xbar_wait(&ex->xbar[attempt], 0u);
          __syncthreads();  // (this CTA's own entry)
          trace("c_counts");
          // One warp reads the counts, a lane a CTA: a loop over the CTAs in every thread costs 1x131072
          // 0.7-0.9 us, 20x134868 0.5 (H200).
          if (threadIdx.x < 32u) {
            const uint32_t c = threadIdx.x;
            const uint4 x = c < csize ? ex->xs[attempt][c] : make_uint4(0u, 0xFFFFFFFFu, 0u, 0u);
            const bool fit = x.x <= uint32_t(kCapacity);
            const uint32_t counted = fit ? x.x : 0u;
            bool ok = __all_sync(0xFFFFFFFFu, fit);
            const uint32_t total = __reduce_add_sync(0xFFFFFFFFu, counted);
            const uint32_t before = __reduce_add_sync(0xFFFFFFFFu, c < rank ? counted : 0u);
            const uint32_t lo = __reduce_min_sync(0xFFFFFFFFu, x.y);
            const uint32_t hi = __reduce_max_sync(0xFFFFFFFFu, x.z);
            const bool few = ok && !plateau && total < k;
            ok = ok && (plateau || total >= k);
            if (c == 0u) {
              cnt.total = ok ? total : ~0u;
              cnt.few = few ? 1u : 0u;
              cnt.before = before;
              cnt.lo = lo;
              cnt.hi = hi;
            }
          }
          __syncthreads();
          trace("c_read");
        } else {
          __syncthreads();
          const uint32_t total = cnt.cand;
          const bool ok = (plateau || total >= k) && total <= uint32_t(kCapacity);
          if (threadIdx.x == 0) {
            cnt.total = ok ? total : ~0u;
            cnt.few = !plateau && total < k ? 1u : 0u;
          }
          __syncthreads();
        }
        const uint32_t total = cnt.total;
        const bool ok = total != ~0u;
        if (!ok && cnt.few != 0u && !wide && !fits) {  // (cluster-uniform) nothing written yet: again
          if (threadIdx.x == 0) {
            cnt.retried = 1u;
            cnt.cand = 0u;  // (a split row's counts were read by every CTA before the last cluster barrier)
            cnt.nbin = 0u;
          }
          range_reset(cnt);
          __syncthreads();
          trace("retry");
          continue;
        }
        const uint32_t r_row = total < k ? total : k;
        // A one-CTA row binned on the sampled range: the threshold bin from its 2048 bins (one scan, no
        // level over the candidates) when it is taken whole or small enough to rank (as select_list
        // stops: kWarpBin entries of mixed values, kRankBin of one), else the candidates' own select.
        ListSelect row_sel{0u, SelectState{0u, 0u, 0u, 0u}};
        BinMode row_mode = BinMode::kWhole;
        bool row_selected = false;
        if constexpr (!kSplit) {
          if (ok && one_round) {
            const OneRoundBins<kRowRoundBits> bins(V, cnt.before);
            const uint32_t small = bins.shift <= one_value_shift<T>() ? kRankBin : kWarpBin;
            row_selected = one_round_select(hist, bins, k, total, 1u, 0u, sh, row_sel, row_mode, small);
          }
        }
        if (kSplit && ok && spread && cnt.hi > cnt.lo && r_row > 0u) {
          // A spread row: the select from the CTAs' summed histograms (no candidate gathered), then each
          // CTA writes its own; a bin that needs another level takes the cluster-wide finish.
          ListSelect sel;
          BinMode mode;
          bool selected = false;
          if (one_round) {
            selected = one_round_select(hist, OneRoundBins<>(V, ex->smax), r_row, total, csize, rank, sh, sel, mode);
            if (!selected) {  // (every slot was read before one_round_select's last barrier)
              radix::clear_hist_block<kThreads>(hist);
              __syncthreads();
            }
          }
          if (selected || hist_select(keys, int(cnt.cand), r_row, total, hist, reinterpret_cast<uint32_t*>(stage), cnt,
                                      sh, ex, csize, rank, sel, mode)) {
            finish<lookups_in_flight<T, kSplit>(), true, true>(keys, cols, int(cnt.cand), r_row, out_of_row(), hist,
                                                             cnt, k, sh, one_value_shift<T>(), 0u, nullptr, csize,
                                                             rank, ex, sel, mode);
          } else {
            finish<lookups_in_flight<T, kSplit>()>(keys, cols, int(cnt.cand), r_row, out_of_row(), hist, cnt, k, sh,
                                                   one_value_shift<T>(), total,
                                                   reinterpret_cast<uint32_t*>(stage), csize, rank);
          }
        } else if (kSplit && ok && total <= uint32_t(kCapacity)) {
          // A split row whose candidates fit one buffer: each CTA pushes its own into rank 0's, after
          // those of the lower ranks; rank 0 selects alone on the cluster's range (a local select cost
          // 1x131072 less than the cluster-wide one: 4.9 against 6.3 us with rank 0's writes) and writes
          // them all. (A spread row comes here only when its candidates are one value or none: no range
          // to bin them on.)
          if (rank != 0) {
            const uint32_t mine = cnt.cand;
            const uint32_t at = cnt.before;
            const uint32_t to_keys = radix::cluster_addr(keys + at, 0u);
            const uint32_t to_cols = radix::cluster_addr(cols + at, 0u);
            const uint32_t bar = radix::cluster_addr(&ex->gbar, 0u);
            for (uint32_t i = threadIdx.x; i < mine; i += kThreads) {
              radix::st_async(to_keys + 4u * i, keys[i], bar);
              radix::st_async(to_cols + 4u * i, uint32_t(cols[i]), bar);
            }
            return;  // (nothing reads this CTA's shared memory after)
          } else {
            if (threadIdx.x == 0) {
              radix::xbar_expect(&ex->gbar, 8u * (total - cnt.cand));  // every other CTA's (key, column) pairs
            }
            radix::xbar_wait(&ex->gbar, 0u);
          }
          trace("gathered");
          finish<lookups_in_flight<T, kSplit>(), true>(keys, cols, int(total), total < k ? total : k, out_of_row(),
                                                       hist, cnt, k, sh, one_value_shift<T>(), 0u, nullptr, 1u, 0u,
                                                       ex);
        } else if (row_selected) {
          finish<lookups_in_flight<T, kSplit>(), false, true>(keys, cols, int(cnt.cand), k, out_of_row(), hist, cnt,
                                                             k, sh, one_value_shift<T>(), 0u, nullptr, 1u, 0u,
                                                             nullptr, row_sel, row_mode);
        } else if (ok) {
          // A one-CTA row (its one-round select declined or not tried: the candidates' own select), or a
          // split row: every CTA writes its own candidates, rank 0 ranks a small threshold bin (the stage
          // buffer holds the summed histograms).
          finish<lookups_in_flight<T, kSplit>()>(keys, cols, int(cnt.cand), total < k ? total : k, out_of_row(), hist,
                                                 cnt, k, sh, one_value_shift<T>(), total,
                                                 kSplit ? reinterpret_cast<uint32_t*>(stage) : nullptr, csize, rank);
        }
        if (rank != 0) {
          return;
        }
        if (ok) {
          if (total >= k) {
            trace("finished");
            return;
          }
          // Plateau, fewer than k candidates (all written): the first k - total keys equal to V.
          trace("to ties");
          GlobalSrc<T> gw;
          gw.init(row_of(), w.lo, w.hi, a.nan_key);
          if (ordered_ties(gw, V, k - total, total, out_of_row(), k, sh) >= k - total) {
            return;
          }
          if (threadIdx.x == 0) {  // fewer keys at V than the sample said: redo the row, every output anew
            cnt.out = 0u;
          }
          __syncthreads();
        }
      }
      break;  // to the exact fallback
    }
  } else if (rank != 0) {
    return;  // a split row without the fast path: rank 0 alone runs the exact fallback
  }
  GlobalSrc<T> g;
  g.init(row_of(), w.lo, w.hi, a.nan_key);
  trace("to exact");
  exact_row<T, lookups_in_flight<T, kSplit>()>(g, n, k, keys, cols, hist, cnt, out_of_row(), sh);
  trace("exact");
}

// kSplit: each row split over a cluster of a.cluster CTAs (a kernel of its own: the cluster finish and
// the one-CTA row in one kernel crowd the 64 registers).
template <typename T, bool kSplit>
__global__ void __launch_bounds__(kThreads, kSplit ? 1 : kCtasPerSm)
    topk_filter_kernel(const __grid_constant__ KernelArgs a) {
  __shared__ SelectShared sh;
  __shared__ Counters cnt;
  extern __shared__ __align__(128) uint4 dyn_smem[];  // (aligned: the cp.async stages' 32-byte sectors)
  pdl_wait();
  // No early pdl_launch_dependents: the next kernel (the MLA decode in a layer step) would pack onto
  // the SMs this grid frees first (sm90_paged_indexer_logits.cuh says what it measured).
  trace_begin();
  if constexpr (kSplit) {
    __shared__ Exchange ex;
    filter_row<T, true>(a, sh, cnt, dyn_smem, &ex);
  } else {
    filter_row<T, false>(a, sh, cnt, dyn_smem, nullptr);
  }
  trace_end();
}

using Kernel = void (*)(KernelArgs);

template <bool kSplit>
Kernel kernel_for(TopkDtype dtype) {
  switch (dtype) {
    case TopkDtype::kFloat32:
      return topk_filter_kernel<float, kSplit>;
    case TopkDtype::kBFloat16:
      return topk_filter_kernel<__nv_bfloat16, kSplit>;
    case TopkDtype::kFloat16:
      return topk_filter_kernel<__half, kSplit>;
  }
  return nullptr;
}

// Allow the kernel kDynSmem bytes of dynamic shared memory on this device and fill active[c] (c = 0..
// kMaxCluster: the clusters of c CTAs the device runs at once), once per kernel and device.
cudaError_t prepare(Kernel kernel, int which, int device, int* active) {
  constexpr int kSizes = topk_heuristics::kMaxCluster + 1;
  static std::atomic<int> cache[6][kMaxDevices][kSizes + 1] = {};  // [kSizes]: 1 once filled
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached && cache[which][device][kSizes].load(std::memory_order_acquire) == 1) {
    for (int c = 0; c < kSizes; ++c) {
      active[c] = cache[which][device][c].load(std::memory_order_relaxed);
    }
    return cudaSuccess;
  }
  DSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kDynSmem));
  active_clusters(kernel, kThreads, kDynSmem, active);
  if (cached) {
    for (int c = 0; c < kSizes; ++c) {
      cache[which][device][c].store(active[c], std::memory_order_relaxed);
    }
    cache[which][device][kSizes].store(1, std::memory_order_release);
  }
  return cudaSuccess;
}

}  // namespace DSA_TOPK_FILTER_DETAIL

#ifdef DSA_TOPK_FILTER_NARROW
static_assert(topk_filter_narrow_detail::kFastRatio * topk_heuristics::kNarrowMaxK <=
                  topk_filter_narrow_detail::kCapacity,
              "the narrow shape's rows take the sampled path");

bool topk_filter_narrow_fits(TopkDtype dtype, int device, int sms) {
  namespace d = topk_filter_narrow_detail;
  const d::Kernel kernel = d::kernel_for<false>(dtype);
  int active[topk_heuristics::kMaxCluster + 1] = {};
  return kernel != nullptr && d::prepare(kernel, 2 * int(dtype), device, active) == cudaSuccess &&
         active[1] >= d::kMinCtasPerSm * sms;
}

cudaError_t launch_topk_filter_narrow(const TopkParams& p, topk_row::KernelArgs a, int sms, cudaStream_t stream) {
  namespace d = topk_filter_narrow_detail;
  namespace h = topk_heuristics;
  const d::Kernel kernel = d::kernel_for<false>(p.dtype);
  if (kernel == nullptr) {
    return cudaErrorInvalidValue;
  }
  a.cluster = 1;
  a.sample = h::filter_sampling() ? 1 : 0;
  a.prefetch_bytes = h::filter_prefetch_bytes(p.rows, 1, sms);
  return launch_pdl(kernel, dim3(unsigned(p.rows)), dim3(unsigned(d::kThreads)), size_t(d::kDynSmem), stream, a);
}
#else
cudaError_t launch_topk_filter(const TopkParams& p, cudaStream_t stream) {
  namespace d = topk_filter_detail;
  namespace h = topk_heuristics;
  const d::Kernel row_kernel = d::kernel_for<false>(p.dtype);
  const d::Kernel split_kernel = d::kernel_for<true>(p.dtype);
  if (row_kernel == nullptr || split_kernel == nullptr) {
    return cudaErrorInvalidValue;
  }
  topk_row::KernelArgs a = topk_row::make_args(p);
  int device = 0;
  int major = 0;
  int sms = 0;
  DSA_CUDA_CHECK(cudaGetDevice(&device));
  DSA_CUDA_CHECK(device_attr<cudaDevAttrComputeCapabilityMajor>(device, &major));
  DSA_CUDA_CHECK(device_attr<cudaDevAttrMultiProcessorCount>(device, &sms));
  int active[h::kMaxCluster + 1] = {};
  int cluster = major >= 9 ? h::cluster_size(p.rows, p.width, p.k, sms) : 1;
  if (cluster > 1) {
    DSA_CUDA_CHECK(d::prepare(split_kernel, 2 * int(p.dtype) + 1, device, active));
    cluster = h::filter_cluster_size(p.rows, cluster, active);
  }
  if (cluster == 1 && h::narrow_rows(p.rows, p.width, p.k, sms) && topk_filter_narrow_fits(p.dtype, device, sms)) {
    return launch_topk_filter_narrow(p, a, sms, stream);  // (fits() set its shared-memory limit)
  }
  if (active[cluster] < 1 || p.rows * cluster > INT32_MAX) {  // (a forced size the device cannot run)
    cluster = 1;
  }
  const d::Kernel kernel = cluster > 1 ? split_kernel : row_kernel;
  if (cluster == 1) {  // (sets the kernel's shared-memory limit; the cluster counts are unused)
    DSA_CUDA_CHECK(d::prepare(row_kernel, 2 * int(p.dtype), device, active));
  }
  a.cluster = cluster;
  a.sample = h::filter_sampling() ? 1 : 0;
  a.prefetch_bytes = h::filter_prefetch_bytes(p.rows, cluster, sms);

  // Rows on the flat grid.x, `cluster` CTAs each.
  return launch_pdl_clustered(kernel, dim3(unsigned(p.rows * cluster)), dim3(unsigned(d::kThreads)),
                              size_t(d::kDynSmem), stream, cluster, a);
}
#endif

}  // namespace dsa_cuda
