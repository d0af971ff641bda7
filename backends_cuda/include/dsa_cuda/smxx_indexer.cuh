// The arch-independent parts of the dense indexer kernels (sm90_indexer_logits*.cuh, sm100_indexer_logits.cuh):
// the kernel arguments, the work items (R query rows x a chunk of key tiles) and how a persistent CTA walks
// them, and the small device helpers every kernel's epilogue uses. Torch-free.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "smxx_memory.cuh"

namespace dsa_cuda {
namespace smxx_indexer {

constexpr int kDim = 128;            // head dim D
constexpr int kN = 128;              // MMA N: rows * heads of a Q tile
constexpr int kMaxChunkTiles = 128;  // 128-key tiles per item at most

struct KernelArgs {
  const uint8_t* q;
  const uint8_t* kv;
  const float* kv_scale;
  const float* weights;
  const int32_t* ks;
  const int32_t* ke;
  float* out;
  int64_t rows;
  int64_t q_row_stride;  // bytes
  int64_t q_head_stride;  // bytes
  int64_t kv_row_stride;  // bytes
  int64_t kv_scale_stride;
  int64_t w_row_stride;
  int64_t w_head_stride;
  int64_t ks_stride;
  int64_t ke_stride;
  int64_t out_row_stride;
  int32_t row_blocks;  // items are (row block, chunk), row block fastest
  int32_t chunks;
  int32_t keys;
  int32_t key_tiles;
  int32_t chunk_tiles;
  int32_t tail_item;   // TailSplitCursor: the first item of the grid's last partial round (items / grid * grid)
  int32_t tail_tiles;  // and that round's tiles, (items - tail_item) * chunk_tiles
  bool clean;
};

// One item's rows and key tiles; identical in the producer and the math warps.
template <int kRows>
struct Item {
  int64_t row0;
  int32_t lo[kRows], hi[kRows];  // clipped windows ([0, 0) for rows past T)
  int32_t t0, t1;                // key tiles to compute
  int32_t k_begin, k_end;        // the chunk's keys, clipped to N
};

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)

using smxx::ldg_early;  // smxx_memory.cuh
using smxx::smem_addr;

// v[r] for a row r known only at run time, by selects (a dynamic index would put v in local memory).
template <int kRows>
__device__ __forceinline__ int32_t row_value(const int32_t (&v)[kRows], int r) {
  int32_t x = v[0];
#pragma unroll
  for (int rr = 1; rr < kRows; ++rr) {
    x = r == rr ? v[rr] : x;
  }
  return x;
}

// o[k] = -inf for k in [from, to), spread over the math threads (scores of keys no tile computes).
template <int kMathThreads>
__device__ __forceinline__ void fill_neg_inf(float* o, int32_t from, int32_t to) {
  for (int32_t k = from + int32_t(threadIdx.x); k < to; k += kMathThreads) {
    o[k] = __int_as_float(int(0xff800000u));
  }
}

// Item (rb, kc), or with [tile_lo, tile_hi) only those tiles of its chunk (chunk-relative; TailSplitCursor's
// pieces).
template <int kRows, int kTileKeys>
__device__ __forceinline__ Item<kRows> decode_item(const KernelArgs& a, int32_t rb, int32_t kc, int32_t tile_lo = 0,
                                                   int32_t tile_hi = INT32_MAX) {
  Item<kRows> it;
  it.row0 = int64_t(rb) * kRows;
  const int32_t c0 = kc * a.chunk_tiles + tile_lo;
  const int32_t c1 = min(kc * a.chunk_tiles + min(tile_hi, a.chunk_tiles), a.key_tiles);
  const int32_t n = a.keys;
  int32_t lo_min = n, hi_max = 0;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = it.row0 + r;
    int32_t lo = 0, hi = 0;
    if (row < a.rows) {
      // Untrusted windows: clip to [0, N); a window with ke <= ks is empty.
      lo = min(max(__ldg(a.ks + row * a.ks_stride), 0), n);
      hi = max(min(max(__ldg(a.ke + row * a.ke_stride), 0), n), lo);
    }
    it.lo[r] = lo;
    it.hi[r] = hi;
    if (hi > lo) {
      lo_min = min(lo_min, lo);
      hi_max = max(hi_max, hi);
    }
  }
  int32_t t0 = max(c0, lo_min / kTileKeys);
  int32_t t1 = min(c1, (hi_max + kTileKeys - 1) / kTileKeys);
  if (t1 <= t0) {
    t0 = t1 = c1;
  }
  it.t0 = t0;
  it.t1 = t1;
  it.k_begin = c0 * kTileKeys;
  it.k_end = min(c1 * kTileKeys, n);
  return it;
}

// clean: -inf over the item's keys outside its computed tiles (no math there).
template <int kRows, int kTileKeys, int kMathThreads>
__device__ __forceinline__ void fill_outside_tiles(const KernelArgs& a, const Item<kRows>& t) {
  const int32_t ka = min(t.t0 * kTileKeys, t.k_end);
  const int32_t kz = min(t.t1 * kTileKeys, t.k_end);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = t.row0 + r;
    if (row < a.rows) {
      float* o = a.out + row * a.out_row_stride;
      fill_neg_inf<kMathThreads>(o, t.k_begin, ka);
      fill_neg_inf<kMathThreads>(o, kz, t.k_end);
    }
  }
}

// A CTA's items of a persistent grid: blockIdx.x, + gridDim.x, ... as (row block, chunk), stepped
// without divisions. Args: the kernel's arguments, with row_blocks and chunks.
template <class Args>
struct ItemCursor {
  int32_t rb, kc, step_rb, step_kc;
  __device__ __forceinline__ explicit ItemCursor(const Args& a) {
    rb = int32_t(blockIdx.x % uint32_t(a.row_blocks));
    kc = int32_t(blockIdx.x / uint32_t(a.row_blocks));
    step_rb = int32_t(gridDim.x % uint32_t(a.row_blocks));
    step_kc = int32_t(gridDim.x / uint32_t(a.row_blocks));
  }
  __device__ __forceinline__ bool valid(const Args& a) const { return kc < a.chunks; }
  __device__ __forceinline__ void next(const Args& a) {
    rb += step_rb;
    kc += step_kc;
    if (rb >= a.row_blocks) {
      rb -= a.row_blocks;
      ++kc;
    }
  }
};

// ItemCursor without its two steps: they are recomputed per item (two divisions an item of up to 64
// tiles), which frees the registers the H 32 instance spilled at 112 (4 bytes).
struct LeanCursor {
  int32_t rb, kc;
  __device__ __forceinline__ explicit LeanCursor(const KernelArgs& a) {
    rb = int32_t(blockIdx.x % uint32_t(a.row_blocks));
    kc = int32_t(blockIdx.x / uint32_t(a.row_blocks));
  }
  __device__ __forceinline__ bool valid(const KernelArgs& a) const { return kc < a.chunks; }
  __device__ __forceinline__ void next(const KernelArgs& a) {
    uint32_t grid;
    asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(grid));  // volatile: not hoisted out of the item loop
    rb += int32_t(grid % uint32_t(a.row_blocks));
    kc += int32_t(grid / uint32_t(a.row_blocks));
    if (rb >= a.row_blocks) {
      rb -= a.row_blocks;
      ++kc;
    }
  }
};

// The TMA kernels' walk: whole items blockIdx.x, + gridDim.x, ... up to a.tail_item, then the tail's tiles
// (its items' chunks, at most one round) cut into gridDim.x equal shares, CTA b taking share b as pieces of
// one or two items (decode_item's [tile_lo, tile_hi)). Whole items alone leave the SMs without a tail item
// idle for the last round: 4096 x 32768, H 64, 2048 items on 132 SMs are 16 items on 68 SMs and 15 on 64.
// A score tile depends on nothing outside it, so a split item costs only its Q and weights staged twice.
// H100, exact mode (config 4), the split against the same build without it, two runs: 4096 x 32768
// 3318 -> 3231 and 3317 -> 3293 us, 4096 x 131072 13253 -> 13002 and 13448 -> 13383; the fp8 mode within its
// spread (docs/design_indexer.md, "The split tail").
// One register across the item loop (the step), the piece recomputed at each item: the 4-warpgroup
// instances have none to spare at 112.
struct TailSplitCursor {
  int32_t step;  // blockIdx.x + gridDim.x i: item `step` below a.tail_item, then piece (step - a.tail_item) / grid

  __device__ __forceinline__ TailSplitCursor() : step(int32_t(blockIdx.x)) {}

  __device__ __forceinline__ static uint32_t grid() {
    uint32_t g;
    asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(g));  // volatile: not held across the item loop
    return g;
  }

  // The current piece's first tile s and its share's end s1, in the tail's tiles. 32-bit: the launcher keeps
  // gridDim.x x a.tail_tiles below 2^31 (64-bit divisions spill the 4-warpgroup kernel at 112 registers).
  __device__ __forceinline__ void piece(const KernelArgs& a, uint32_t& s, uint32_t& s1) const {
    const uint32_t g = grid(), ct = uint32_t(a.chunk_tiles), w = uint32_t(a.tail_tiles), b = blockIdx.x;
    const uint32_t s0 = b * w / g;
    s1 = (b + 1) * w / g;
    const uint32_t p = (uint32_t(step - a.tail_item) - b) / g;
    s = p == 0 ? s0 : (s0 / ct + p) * ct;  // piece p starts at the p-th item boundary past s0
  }

  __device__ __forceinline__ bool valid(const KernelArgs& a) const {
    if (step < a.tail_item) {
      return true;
    }
    uint32_t s, s1;
    piece(a, s, s1);
    return s < s1;
  }

  template <int kRows, int kTileKeys>
  __device__ __forceinline__ Item<kRows> decode(const KernelArgs& a) const {
    int32_t item = step, lo = 0, hi = a.chunk_tiles;
    if (step >= a.tail_item) {
      uint32_t s, s1;
      piece(a, s, s1);
      const uint32_t ct = uint32_t(a.chunk_tiles);
      item = a.tail_item + int32_t(s / ct);
      lo = int32_t(s % ct);
      hi = int32_t(min(ct, uint32_t(lo) + (s1 - s)));
    }
    return decode_item<kRows, kTileKeys>(a, int32_t(uint32_t(item) % uint32_t(a.row_blocks)),
                                         int32_t(uint32_t(item) / uint32_t(a.row_blocks)), lo, hi);
  }

  __device__ __forceinline__ void next() { step += int32_t(grid()); }
};

#endif

}  // namespace smxx_indexer
}  // namespace dsa_cuda
