// Host-side launch choices of the top-k kernels (kernels/topk.cu), in one place. Torch-free.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>

namespace dsa_cuda {
namespace topk_heuristics {

// A row is split over at most this many CTAs (a portable thread-block cluster size).
constexpr int kMaxCluster = 8;
// Each CTA of a split row gets at least this many keys.
constexpr int64_t kMinPart = 8192;
// A split row spreads its finish over its CTAs from this many CTAs up: each keeps its candidates and
// writes its own; the select runs on their histograms summed slice by slice (hist_select), or in one
// round when a first sampled attempt binned them in its filter pass and sent the bins with its count
// (one_round_select). Below, a row whose candidates fit one buffer gathers them into rank 0, which
// writes them all. H200, graph replay, k 2048: hist_select against rank 0 selecting on the gathered
// candidates and sending the select back, 1 x 131072 12.0-12.4 -> 11.6-11.8 us. The gate, measured with
// that gathered select, unspread -> spread: 20 x 134868 (5 CTAs) 15.2-16.0 -> 14.8-15.3 us, 1 x 131072
// (8) 12.6-13.4 -> 12.4-12.5. At 2 CTAs (64 x 131072 walk rows) spread or not measured the same, both
// 0.5 us slower than a build without the spread finish: the gate assumes 2 CTAs gain nothing from it.
// At 3, forced, spread: 20 x 134868 16.3 against 17.3 us, 1 x 131072 16.1 against 16.3, 64 x 131072
// 30.9 against 28.8 (mixed: the gate stays; rows get 3 CTAs at 33 to 44 rows, none of the benchmarked
// shapes).
constexpr int kSpreadFinishMinCluster = 4;

// Test overrides, from the environment: DSA_OPS_TOPK_CLUSTER=1..8 forces the CTAs per row (tests use it
// to reach every path on any shape; unset or out of range: none), DSA_OPS_TOPK_SAMPLE=0 turns the filter
// kernel's sampled threshold off (to reach its exact fallback). Read at the first launch and again by
// read_overrides() (torch.ops.dsa_cuda.topk_read_env, for tests that change them in-process), not on every
// launch: three getenv calls took ~0.3 us a launch on the H200 host (86 variables;
// tools/smxx_launch_host_cost.cu).
struct Overrides {
  std::atomic<int> cluster{0};  // 0: none
  std::atomic<bool> sampling{true};

  Overrides() { read(); }

  // Set both from the environment now.
  void read() {
    int forced = 0;
    if (const char* env = std::getenv("DSA_OPS_TOPK_CLUSTER")) {
      forced = std::atoi(env);
      forced = forced >= 1 && forced <= kMaxCluster ? forced : 0;
    }
    const char* sample = std::getenv("DSA_OPS_TOPK_SAMPLE");
    cluster.store(forced, std::memory_order_relaxed);
    sampling.store(sample == nullptr || sample[0] != '0', std::memory_order_relaxed);
  }
};

// The overrides, read from the environment at the first call.
inline Overrides& overrides() {
  static Overrides o;
  return o;
}

// Read the overrides from the environment again.
inline void read_overrides() { overrides().read(); }

// The forced CTAs per row (DSA_OPS_TOPK_CLUSTER), 0 when none.
inline int forced_cluster() { return overrides().cluster.load(std::memory_order_relaxed); }

// CTAs per row. Few long rows (decode: 1 to 64 rows of 64K to 1M keys) would leave most SMs idle
// with one CTA per row, so each row is split over a cluster whose CTAs merge their histograms
// through distributed shared memory; enough rows to fill the GPU keep one CTA per row.
// DSA_OPS_TOPK_CLUSTER=1..8 forces the size (1 turns splitting off; tests use it to reach both
// paths on any shape).
inline int cluster_size(int64_t rows, int64_t width, int64_t k, int sms) {
  if (const int forced = forced_cluster()) {
    return forced;
  }
  if (rows <= 0 || sms <= 0 || width <= k) {
    return 1;
  }
  int64_t c = int64_t(sms) / rows;
  c = c < kMaxCluster ? c : kMaxCluster;
  c = c < width / kMinPart ? c : width / kMinPart;
  return c < 2 ? 1 : int(c);
}

// CTAs per row of the filter kernel (deterministic=False), given c = cluster_size(rows, ...): split
// rows while they leave SMs without a CTA, up to one CTA per SM (c at most), in the largest cluster size
// of which the device runs `rows` clusters at once. active[c] (c = 0..kMaxCluster): clusters of c CTAs the device holds together
// (cudaOccupancyMaxActiveClusters); a GPC holds whole clusters, so CTAs alone do not say it. H200 (graph
// replay, k 2048): 1 x 131072 12.8 us with 8 CTAs a row, 13.5 with 6, 13.9 with 4;
// 20 x 134868 15.5 with 5, 16.0 with 4, 23.3 with 6 (its 20 clusters of 6 did not all fit: two waves);
// 64 x 131072 18.1 with 2, 27.6 with 3. Two CTAs per SM did worse (64 x 1M keys 117 us with 2 CTAs
// a row, 173 with 4). Same override as cluster_size (taken as it is).
inline int filter_cluster_size(int64_t rows, int c, const int* active) {
  if (forced_cluster() != 0) {
    return c;
  }
  for (int s = c; s >= 2; --s) {
    if (active[s] >= rows) {
      return s;
    }
  }
  return 1;
}

// Whether the filter kernel samples a threshold for windows longer than its candidate buffer
// (else it runs its exact fallback on them). DSA_OPS_TOPK_SAMPLE=0 turns it off (see Overrides).
inline bool filter_sampling() { return overrides().sampling.load(std::memory_order_relaxed); }

// Bytes of the head of its part a filter CTA asks L2 for during its sample select (shared-memory work,
// while its row's DRAM traffic would pause): 64 KB, about what DRAM gives each of 264 CTAs in ~4 us, when
// there are more rows than the two CTAs an SM runs at once, so that CTAs drift apart and one's
// prefetch overlaps other CTAs' selects. H200 (64 KB for every row): 16384x65536
// -5.6%, 4096x32768 -1.5%; but 256x131072, all rows in step, +6% and 20x134868 (clusters) +2.5%.
inline int32_t filter_prefetch_bytes(int64_t rows, int cluster, int sms) {
  return cluster == 1 && rows > 2 * int64_t(sms) ? 64 * 1024 : 0;
}

// Whether one-CTA rows run the filter kernel's narrow shape (256 threads, four CTAs an SM, 4608
// candidates; kernels/topk_filter.cu): rows longer than the wide shape's candidate buffer (8192 keys:
// read once into shared memory there) and up to kNarrowMaxWidth keys, k up to kNarrowMaxK (its sampled
// path's limit), and three rows an SM or more (fewer leave its last wave emptier than the wide shape's).
// H200, k 2048, fp32, wide -> narrow at three CTAs an SM (us): 4096 rows of 12288 keys 201.7 -> 169.2,
// 16384 200.3 -> 181.3, 24576 223.8 -> 204.5, 32768 241.1 -> 223.3, 40960 262.3 -> 250.7, 49152
// 281.8 -> 278.2, 65536 327.3 -> 335.3; 32768 keys: 512 rows 37.9 -> 43.5, 1024 68.6 -> 66.8, 2048
// 127.7 -> 120.2. Narrow at four CTAs an SM: 4096 rows of 12288 keys 145.5, 32768 197.4, 49152 258.2;
// 1024 x 32768 59.6; the row bound at three rows an SM against six: 400 x 32768 35.1 -> 33.4, 512 x
// 32768 37.2 -> 35.0, 512 x 12288 30.8 -> 27.3, 512 x 49152 42.9 -> 42.3 (ties 512 x 32768 49.4 -> 56.8).
// Up to 65536 keys refuted: 16384 x 65536 1231 -> 1170 but its random walks 1329 -> 1371, 4096 x 65536
// NaN/inf rows 343 -> 575 (4608 candidates: first attempts miss).
constexpr int64_t kNarrowMaxWidth = 49152;
constexpr int64_t kNarrowMaxK = 2048;
inline bool narrow_rows(int64_t rows, int64_t width, int64_t k, int sms) {
  return rows >= 3 * int64_t(sms) && width > 8192 && width <= kNarrowMaxWidth && k <= kNarrowMaxK;
}

// Whether a row too long for shared memory (one CTA per row) first tries the sampled-threshold
// filter: one read of the row when it works, one extra read when it does not (ties, plateaus).
// DSA_OPS_TOPK_SAMPLE=0 turns it off (tests use it to reach the plain stream path).
inline bool sampled_filter(int cluster) { return filter_sampling() && cluster == 1; }

// Threads per CTA: a power of two from 128 to 1024 (it must divide the 2048 histogram bins), about
// 16 keys per thread at least. At up to 64 registers a thread an SM holds one 1024-thread CTA or two
// of 512: take 512 where shared memory lets two CTAs share an SM (one CTA's barrier-bound phases
// then overlap the other's loads). Split rows run one CTA per SM: 1024.
inline int threads(int64_t width, int cluster, int ctas_by_smem) {
  if (cluster > 1) {
    return 1024;
  }
  if (width <= 2048) {
    return 128;
  }
  if (width <= 4096) {
    return 256;
  }
  return ctas_by_smem >= 2 ? 512 : 1024;
}

}  // namespace topk_heuristics
}  // namespace dsa_cuda
