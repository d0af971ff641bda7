// dsa.paged_indexer_logits on Hopper (sm_90a): the indexer scoring core (sm90_indexer_core.cuh) over
// a paged fp8 cache, warp-specialised, persistent.
//
// Work: an item is (R query tokens of one request, a run of tiles of its positions), R = 1, 2 or 4
// (R * H <= 128), so the Q tile of R tokens x H heads is the MMA's N = R * H (32, 64 or 128; next_n = 1
// at H = 64 is N = 64, not a half-empty 128). A persistent grid (one CTA per SM) takes the items by one
// of two schedules (Schedule below, a kernel argument): fixed chunks strided over the grid, or the
// row blocks' tiles laid end to end and cut into one equal range per CTA (no CTA more than one tile
// above the mean, and a CTA keeps one Q tile for its whole range but where the range crosses a
// request). Both come from the arguments alone: no schedule is computed by another kernel.
//
// CTA: kWgs (2 or 3) math warpgroups + 1 producer warp, as in indexer_logits, or math warpgroups fed by a
// producer warpgroup. Config digit 4 (kWgProducer; the default at N = 128): 3 math warpgroups at N = 128 with a
// producer warpgroup, setmaxnreg 40 / 152 (Cfg), weights in registers, the same core calls. At N = 128 a page is
// a serial MMA + epilogue chain per warpgroup, and 2 warpgroups measured 207.7 us against DeepGEMM's 150.5
// (H200, fp8, H 64, 64 x 65536, next_n 2); 3 warpgroups with a producer warp (416 threads: 128 registers,
// weights in shared memory) measured 276.4; 3 fed by a producer warpgroup 182.4 (DeepGEMM 153.3, same run).
// Config digit 5 (the default at N <= 64): 4 math warpgroups fed by a producer warpgroup (setmaxnreg 32 / 112);
// H100, next_n 1 on L2-resident pages (the math bound): 131.1 us with 3 warpgroups and a producer warp -> 117.1.
// - A tile is kWgs cache blocks (pages of 64 positions): warpgroup w's 64 keys are logical page
//   kWgs * tile + w, the dense kernel's 64-key warpgroup tile. The producer looks up an item's block ids
//   (at most 64 pages: two loads per lane, the next item's in flight while this item is copied),
//   broadcasts each with a shuffle, and copies the page's 64 x 128 fp8 bytes and its 64 fp32 scales
//   into the stage by one of two loaders (kBulk, a template argument): 16-byte cp.async by the whole
//   warp into 128-byte XOR-swizzled rows (as the dense tiles), or two bulk copies a page
//   (cp.async.bulk, the TMA engine: one instruction for 8 KB, no per-thread request tracking) into
//   plain 128-byte rows, which the math threads read in a bank-conflict-free order. The math warps take the
//   same ids the same way (one lookup per item, not a dependent load per tile). Pages past the item's
//   last visible position are never copied (their table entries may be read, inside [0, max_blocks)); a block
//   id outside [0, num_blocks) is never read, its positions score -inf.
// - Math warpgroups: the dense kernel's core (A fragments from the stage, wgmma against the Q tile,
//   relu / weights / head sum / key scale), then a store masked by each token's visible length. Loader 3
//   (kTma, with a producer warpgroup, fp8, N = 128): a page is one TMA box into 128-byte-swizzled rows and the MMAs
//   read it as A from shared memory, as the dense TMA kernel does: no A-fragment loads and no chunk-order
//   selects on a warpgroup's serial page chain, the stage released once the MMAs completed; with A out of the
//   registers, 4 math warpgroups fit at N = 128 too.
// - Tiles past the item's last visible position are not loaded or multiplied; their scores are
//   written -inf directly when `clean`.
//
// Torch-free. Included by paged_indexer_logits.cuh under __CUDACC__.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include <cstdint>

#include "common_launch.cuh"
#include "sm90_indexer_core.cuh"
#include "smxx_tma.cuh"

namespace dsa_cuda {
namespace sm90_paged_indexer {

using namespace sm90_indexer;  // the scoring core: Mode, kWgKeys, kDim, PTX helpers, score_tile, ...

constexpr int kPage = 64;       // positions per cache block: one warpgroup's 64 keys
constexpr int kItemPages = 64;  // pages per item at most: two block-table loads per lane
constexpr int kPageBytes = kPage * kDim;  // a block's fp8 values (its 64 fp32 scales follow)
constexpr int kPageScaleBytes = kPage * 4;

// How the persistent grid takes its items (KernelArgs::schedule).
enum Schedule : int32_t {
  kChunks = 0,    // items (row block, chunk of chunk_tiles tiles), chunk-major, strided over the CTAs
  kBalanced = 1,  // the row blocks' key tiles end to end, one contiguous range of total_tiles / grid a CTA
};

// kWgs math warpgroups (2, 3 or 4), each one page of every kWgs-page tile. kWgProducer: the producer is
// a whole warpgroup, so setmaxnreg can move its registers to the math threads; its first warp copies, the
// other three exit. Config digit 4 (3 math warpgroups at N = 128, the default there) and digit 5 (4 math
// warpgroups at N <= 64, or at N = 128 with loader 3; four pages in flight an SM as DeepGEMM's paged kernel
// keeps).
template <int kMode, int kN, int kWgs, bool kWgProducer = false>
struct Cfg {
  static constexpr int kMathThreads = 128 * kWgs;
  static constexpr int kThreads = kMathThreads + (kWgProducer ? 128 : 32);  // + the producer warp(group)
  static constexpr int kProducerWarp = kMathThreads / 32;
  // kWgProducer registers, from the CTA's pool of kThreads x the launch bound's registers:
  // - 3 math warpgroups (512 threads start at 128): 128 x 40 + 384 x 152 = 63488 <= 65536. 152 against the
  //   157-164 the 2-warpgroup N = 128 kernels use unconstrained: 64 accumulators, 32 weights, 16 A-fragment
  //   words (32 in the fp16 mode), addresses; at 128 (416 threads) the weights had to go to shared memory.
  // - 4 math warpgroups (640 threads start at 96): 128 x 32 + 512 x 112 = 61440 <= 61440. N <= 64 uses
  //   117-124 unconstrained and none spill at 112; with a producer warp (544 threads, 96 a thread) the fp8
  //   kernel spilled 40 bytes.
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegs = kWgs == 4 ? 32 : 40;
  static constexpr int kMathRegs = kWgs == 4 ? 112 : 152;
  static_assert(kWgs == 4 ? kWgProducer : kWgs == 2 || kWgs == 3, "math warpgroups");
  static_assert(!kWgProducer || (kWgs >= 3 && 128 * kProducerRegs + kMathThreads * kMathRegs <= kThreads * kLaunchRegs),
                "setmaxnreg asks for more registers than the CTA starts with");
  static constexpr int kTileKeys = kPage * kWgs;
  static constexpr int kMaxChunkTiles = kItemPages / kWgs;
  static constexpr int kKvRowBytes = ModeTraits<kMode>::kKvRowBytes;  // fp8: one byte per element
  static constexpr int kStageBytes = kTileKeys * kKvRowBytes;
  static constexpr int kScaleBytes = kTileKeys * 4;
  static constexpr int kQBytes = kN * ModeTraits<kMode>::kQRowBytes;
  // 8, or as many as fit: 7 for 3 warpgroups at N = 128 in the fp16 mode (32 KB of Q; 8 would need 236672 B),
  // 6 for 4 warpgroups (24 pages, as 8 stages of 3).
  static constexpr int kFitStages = (227 * 1024 - 1024 - kQBytes) / (kStageBytes + kScaleBytes + 16);
  static constexpr int kStages = kFitStages < 8 ? kFitStages : 8;
  // 1024 of slack: the swizzled tiles start 1024-aligned. Then Q, the key stages, the scale stages,
  // the full / empty barriers.
  static constexpr int kSmemBytes = 1024 + kQBytes + kStages * (kStageBytes + kScaleBytes) + 2 * kStages * 8;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");  // 3 warpgroups at N = 128: 220288 B (fp8 MMA)
};

struct KernelArgs {
  const uint8_t* q;
  const uint8_t* cache;
  const float* weights;
  const int32_t* ctx;
  const int32_t* table;
  float* out;
  int64_t q_batch_stride;  // bytes
  int64_t q_token_stride;
  int64_t q_head_stride;
  int64_t block_stride;  // bytes
  int64_t w_row_stride;
  int64_t w_head_stride;
  int64_t ctx_stride;
  int64_t table_row_stride;
  int64_t table_col_stride;
  int64_t out_row_stride;
  int32_t next_n;
  int32_t groups;      // token groups of R per request
  int32_t row_blocks;  // B * groups; items are (row block, chunk), row block fastest
  int32_t chunks;       // kChunks: chunks per row block
  int32_t chunk_tiles;  // tiles per item at most (kChunks: the chunk length)
  int32_t schedule;     // Schedule
  int64_t total_tiles;  // kBalanced: row_blocks * key_tiles
  int32_t key_tiles;   // ceil(L / tile positions)
  int32_t width;       // L
  int32_t limit;       // min(L, 64 * max_blocks): no position at or past it is visible
  int32_t num_blocks;
  bool clean;
};

// One item's tokens and tiles; identical in the producer and the math warps.
template <int kRows>
struct Item {
  int64_t row0;       // output row of the group's first token
  int32_t b;          // request
  int32_t i0;         // the group's first token inside the request
  int32_t ntok;       // tokens of the group (rows r >= ntok are padding)
  int32_t hi[kRows];  // visible positions [0, hi[r]) of token r
  int32_t pages;      // logical pages holding a visible position: block_table[b, :pages] is looked up
  int32_t t0, t1;     // tiles to compute
  int32_t k_begin, k_end;  // the chunk's positions, clipped to L
};

#if DSA_SM90_INDEXER_DEVICE

// The item from its request's (untrusted) context length `ctx`.
template <int kRows, int kTileKeys>
__device__ __forceinline__ Item<kRows> decode_item(const KernelArgs& a, int32_t rb, int32_t c0, int32_t c1,
                                                   int32_t ctx) {
  Item<kRows> it;
  it.b = rb / a.groups;
  it.i0 = (rb - it.b * a.groups) * kRows;
  it.ntok = min(kRows, a.next_n - it.i0);
  it.row0 = int64_t(it.b) * a.next_n + it.i0;
  int32_t hi_max = 0;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    // Token i sees p < ctx - next_n + i + 1, clipped to [0, limit) (64-bit: ctx is untrusted).
    const int64_t h = int64_t(ctx) - a.next_n + it.i0 + r + 1;
    it.hi[r] = r < it.ntok ? int32_t(min(max(h, int64_t{0}), int64_t(a.limit))) : 0;
    hi_max = max(hi_max, it.hi[r]);
  }
  it.pages = (hi_max + kPage - 1) / kPage;
  it.t0 = c0;
  it.t1 = max(c0, min(c1, (hi_max + kTileKeys - 1) / kTileKeys));
  it.k_begin = c0 * kTileKeys;
  it.k_end = min(c1 * kTileKeys, a.width);
  return it;
}

// A CTA's items in order under either schedule: row block rb, tiles [c0, c1) (c1 - c0 <= chunk_tiles).
// kBalanced: u, e are the flat tile position rb * key_tiles + c0 and the CTA's end (total_tiles < 2^31,
// the launcher's limit); kChunks: u is the chunk of the item, stepped by the grid without a stored stride.
struct WorkCursor {
  int32_t rb, c0, c1, u, e;

  __device__ __forceinline__ explicit WorkCursor(const KernelArgs& a) {
    if (a.schedule == kBalanced) {
      u = int32_t(int64_t(blockIdx.x) * a.total_tiles / gridDim.x);
      e = int32_t(int64_t(blockIdx.x + 1) * a.total_tiles / gridDim.x);
    } else {
      rb = int32_t(blockIdx.x % uint32_t(a.row_blocks));
      u = int32_t(blockIdx.x / uint32_t(a.row_blocks));
      e = 0;
    }
    settle(a);
  }
  __device__ __forceinline__ bool valid(const KernelArgs& a) const {
    return a.schedule == kBalanced ? u < e : u < a.chunks;
  }
  __device__ __forceinline__ void next(const KernelArgs& a) {
    if (a.schedule == kBalanced) {
      u += c1 - c0;
    } else {  // as ItemCursor::next
      rb += int32_t(gridDim.x % uint32_t(a.row_blocks));
      u += int32_t(gridDim.x / uint32_t(a.row_blocks));
      if (rb >= a.row_blocks) {
        rb -= a.row_blocks;
        ++u;
      }
    }
    settle(a);
  }

 private:
  // c0, c1 (and rb for kBalanced) of the position; meaningless once !valid.
  __device__ __forceinline__ void settle(const KernelArgs& a) {
    if (a.schedule == kBalanced) {
      rb = u / a.key_tiles;
      c0 = u - rb * a.key_tiles;
      c1 = min(min(c0 + a.chunk_tiles, a.key_tiles), c0 + (e - u));
    } else {
      c0 = u * a.chunk_tiles;
      c1 = min(c0 + a.chunk_tiles, a.key_tiles);
    }
  }
};

__device__ __forceinline__ int32_t load_ctx(const KernelArgs& a, int32_t rb) {
  return ldg_early(a.ctx + int64_t(rb / a.groups) * a.ctx_stride);
}

// Lane j's block ids of row block rb's tiles [c0, c1): logical pages kWgs c0 + j and kWgs c0 + 32 + j (-1 past
// the chunk or the table's columns). Read before the request's context length is known (a table entry of a page
// the context does not reach is read, never used: mask_pages drops it), so an item's first copy waits on one
// global round trip less. The loads stay in flight until the ids are used.
template <int kWgs>
__device__ __forceinline__ void load_pages(const KernelArgs& a, int32_t rb, int32_t c0, int32_t c1, int lane,
                                           int32_t (&ids)[2]) {
  const int32_t* row = a.table + int64_t(rb / a.groups) * a.table_row_stride;
  const int32_t columns = (a.limit + kPage - 1) / kPage;  // limit <= 64 * max_blocks
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int32_t pg = kWgs * c0 + 32 * h + lane;
    ids[h] = -1;
    if (pg < kWgs * c1 && pg < columns) {
      ids[h] = ldg_early(row + int64_t(pg) * a.table_col_stride);
    }
  }
}

// -1 for the pages of item t that hold no visible position (past t.pages) or that it does not compute (past
// tile t.t1): such pages are neither copied nor scored.
template <int kWgs, int kRows>
__device__ __forceinline__ void mask_pages(const Item<kRows>& t, int lane, int32_t (&ids)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int32_t pg = kWgs * t.t0 + 32 * h + lane;
    if (!(pg < kWgs * t.t1 && pg < t.pages)) {
      ids[h] = -1;
    }
  }
}

// The block id of the item's page j (< 64, warp-uniform) from the lane holding it.
__device__ __forceinline__ int32_t page_id(const int32_t (&ids)[2], int j) {
  return __shfl_sync(0xffffffffu, j < 32 ? ids[0] : ids[1], j & 31);
}

// This CTA's items in order, as a software pipeline shared by the producer and the math warps: while
// item k is worked on, item k + 1's block ids and item k + 2's context length are in flight, so an item
// starts with no dependent global load. Items are decoded again from their context length when taken
// (a few integer ops) rather than held in registers.
template <int kRows, int kWgs>
struct ItemPipeline {
  static constexpr int kTileKeys = kPage * kWgs;
  WorkCursor nxt;             // item k + 1
  int32_t rb0, c00, c10;      // item k
  int32_t ctx0 = 0, ctx1 = 0;  // context lengths of items k and k + 1
  int32_t next_ids[2] = {-1, -1};
  bool valid;

  __device__ __forceinline__ ItemPipeline(const KernelArgs& a, int lane) : nxt(a) {
    valid = nxt.valid(a);
    if (valid) {
      ctx0 = load_ctx(a, nxt.rb);
      advance(a);
      load_pages<kWgs>(a, rb0, c00, c10, lane, next_ids);
    }
  }

  // The next item (its decode, row block and block ids); false when there is none. Starts the loads of
  // the items after it.
  __device__ __forceinline__ bool take(const KernelArgs& a, int lane, Item<kRows>& t, int32_t& rb, int32_t (&ids)[2]) {
    if (!valid) {
      return false;
    }
    rb = rb0;
    t = decode_item<kRows, kTileKeys>(a, rb0, c00, c10, ctx0);
    ids[0] = next_ids[0];
    ids[1] = next_ids[1];
    mask_pages<kWgs>(t, lane, ids);
    valid = nxt.valid(a);
    if (valid) {
      load_pages<kWgs>(a, nxt.rb, nxt.c0, nxt.c1, lane, next_ids);
      ctx0 = ctx1;
      advance(a);
    }
    return true;
  }

 private:
  // Item k := item k + 1 (its context length already in ctx0), the cursor one on, its length loaded.
  __device__ __forceinline__ void advance(const KernelArgs& a) {
    rb0 = nxt.rb;
    c00 = nxt.c0;
    c10 = nxt.c1;
    nxt.next(a);
    ctx1 = nxt.valid(a) ? load_ctx(a, nxt.rb) : 0;
  }
};

// L2 policy for the key pages: each is read once per call, so they go first.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}

// `bytes` (a multiple of 16) from global `src` to shared `dst` (both 16-byte aligned) by the TMA engine;
// completes as transaction bytes on `bar`.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                          uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}

// The producer warp's walk over this CTA's tiles in order: waits until a tile's stage is free (the math
// warps have taken its previous use), then fill(stage, ids, page0) copies the tile into it, its pages
// being the item's pages page0 .. page0 + kWgs - 1 (block ids: page_id(ids, j)).
template <int kRows, int kWgs, int kStages, class Fill>
__device__ __forceinline__ void for_each_free_stage(const KernelArgs& a, int lane, uint32_t empty, Fill&& fill) {
  ItemPipeline<kRows, kWgs> pipe(a, lane);
  Item<kRows> t;
  int32_t rb, ids[2];
  uint32_t it = 0;
  while (pipe.take(a, lane, t, rb, ids)) {
    for (int32_t tile = t.t0; tile < t.t1; ++tile, ++it) {
      const uint32_t stage = it % kStages;
      if (it >= uint32_t(kStages)) {
        mbar_wait(empty + stage * 8, ((it / kStages) - 1) & 1);
      }
      fill(stage, ids, kWgs * (tile - t.t0));
    }
  }
}

// The kBulk producer: the warp walks the items (the block ids are spread over its lanes) and lane 0
// issues two copies a valid page, the 8 KB of values and the 256 bytes of scales (a bulk copy), after
// announcing the stage's byte count on its full barrier. The values: a bulk copy into plain 128-byte rows, or
// (kTma) one TMA box of `map` ([blocks][64 rows][128 bytes]) into 128-byte-swizzled rows, the K-major layout
// the MMA's A descriptor reads. Both evict-first in L2: H100, 64 x 65536 on distinct pages, evict-normal
// bulk copies measured 196.2 -> 207.2 us at next_n 1 and 211.8 -> 218.1 at next_n 2 (the lines they evict
// are then others' dirty ones, written back inside the kernel).
template <int kMode, int kHeads, int kRows, int kWgs, bool kWgProducer, bool kTma>
__device__ __forceinline__ void producer_bulk(const KernelArgs& a, const CUtensorMap* map, uint32_t stages,
                                              uint32_t scales, uint32_t full, uint32_t empty) {
  using C = Cfg<kMode, kHeads * kRows, kWgs, kWgProducer>;
  static_assert(C::kKvRowBytes == kDim, "bulk pages hold fp8 rows");
  const int lane = threadIdx.x & 31;
  const uint64_t policy = evict_first_policy();
  for_each_free_stage<kRows, kWgs, C::kStages>(a, lane, empty, [&](uint32_t stage, const int32_t(&ids)[2], int page0) {
    int32_t id[kWgs];
    uint32_t bytes = 0;
#pragma unroll
    for (int w = 0; w < kWgs; ++w) {
      id[w] = page_id(ids, page0 + w);
      if (id[w] >= 0 && id[w] < a.num_blocks) {  // warp-uniform
        bytes += kPageBytes + kPageScaleBytes;
      }
    }
    if (lane == 0) {
      const uint32_t bar = full + stage * 8;
      mbar_arrive_expect_tx(bar, bytes);
#pragma unroll
      for (int w = 0; w < kWgs; ++w) {
        if (id[w] >= 0 && id[w] < a.num_blocks) {
          const uint8_t* blk = a.cache + int64_t(id[w]) * a.block_stride;
          if constexpr (kTma) {
            smxx::tma_load_3d_hint(stages + stage * C::kStageBytes + w * kPageBytes, map, 0, 0, id[w], bar, policy);
          } else {
            bulk_copy(stages + stage * C::kStageBytes + w * kPageBytes, blk, kPageBytes, bar, policy);
          }
          bulk_copy(scales + stage * C::kScaleBytes + w * kPageScaleBytes, blk + kPageBytes, kPageScaleBytes, bar,
                    policy);
        }
      }
    }
    __syncwarp();
  });
}

// load_a_fragments (sm90_indexer_core.cuh) for a tile of plain (unswizzled) 128-byte fp8 rows: the same
// fragments. A thread reads 16-byte chunks 2c and 2c + 1 of each row; rows g and g + 1 of a quarter-warp
// would hit the same banks in the same order, so odd rows read the two chunks in the other order.
template <int kMode>
__device__ __forceinline__ void load_a_fragments_rows(uint32_t tile_smem, int kr0, int kr1, int c,
                                                      uint32_t (&fa)[ModeTraits<kMode>::kSteps][4]) {
  using T = ModeTraits<kMode>;
  static_assert(T::kRowWords == 8 && T::kKvRowBytes == kDim, "plain rows hold fp8 keys");
  const int flip = kr0 & 1;  // kr1 = kr0 + 8: the same parity
  uint4 x[2], y[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int ch = 2 * c + (j ^ flip);
    x[j] = lds128(tile_smem + kr0 * kDim + ch * 16);
    y[j] = lds128(tile_smem + kr1 * kDim + ch * 16);
  }
  uint32_t r0[8], r1[8];
#pragma unroll
  for (int v = 0; v < 2; ++v) {  // chunk 2c + v was read by instruction v ^ flip
    const uint4 xv = flip ? x[v ^ 1] : x[v];
    const uint4 yv = flip ? y[v ^ 1] : y[v];
    put_chunk(r0, v, xv);
    put_chunk(r1, v, yv);
  }
  fragments_from_words<kMode>(r0, r1, fa);
}

// score_tile (sm90_indexer_core.cuh) over plain rows: the same fragments, so the same scores bit for bit.
template <int kMode, int kHeads, int kN>
__device__ __forceinline__ void score_tile_rows(uint32_t tile_smem, int kr0, int kr1, int c, uint32_t empty_bar,
                                                uint64_t q_desc, float (&acc)[kN / 2], const float (&w)[kN / 4],
                                                float s0, float s1, float (&part)[2 * (kN / kHeads)]) {
  uint32_t fa[ModeTraits<kMode>::kSteps][4];
  load_a_fragments_rows<kMode>(tile_smem, kr0, kr1, c, fa);
  score_fragments<kMode, kHeads, kN>(fa, empty_bar, q_desc, acc, w, s0, s1, part);
}

template <int kMode, int kHeads, int kRows, int kWgs, bool kWgProducer>
__device__ __forceinline__ void producer(const KernelArgs& a, uint32_t stages, uint32_t scales, uint32_t full,
                                         uint32_t empty) {
  using C = Cfg<kMode, kHeads * kRows, kWgs, kWgProducer>;
  // As in the dense producer: a lane always copies the same 16-byte column `ch` of rows r0, r0 + 4, ...,
  // so every copy's destination is a base plus a constant.
  constexpr int kChunks = C::kKvRowBytes / 16;  // 8
  constexpr int kStep = 32 / kChunks;           // rows per pass of the warp
  constexpr int kPasses = kPage / kStep;        // passes per page
  constexpr int kPeriod = 8 / kStep;            // passes per 8 rows (one swizzle period)
  const int lane = threadIdx.x & 31;
  const int ch = lane % kChunks;
  const int r0 = lane / kChunks;
  uint32_t dst_off[kPeriod];
#pragma unroll
  for (int p = 0; p < kPeriod; ++p) {
    const int r = r0 + p * kStep;
    dst_off[p] = uint32_t(r * C::kKvRowBytes + ((ch ^ (r & 7)) << 4));
  }
  const int64_t lane_src = int64_t(r0) * C::kKvRowBytes + ch * 16;
  constexpr int kScaleOffset = kPage * kDim;  // the block's scales follow its 64 * D fp8 values

  for_each_free_stage<kRows, kWgs, C::kStages>(a, lane, empty, [&](uint32_t stage, const int32_t(&ids)[2], int page0) {
#pragma unroll
    for (int w = 0; w < kWgs; ++w) {
      const int32_t id = page_id(ids, page0 + w);
      if (id >= 0 && id < a.num_blocks) {  // warp-uniform
        const uint8_t* blk = a.cache + int64_t(id) * a.block_stride;
        const uint8_t* src = blk + lane_src;
        const uint32_t dst = stages + stage * C::kStageBytes + w * kPage * C::kKvRowBytes;
#pragma unroll
        for (int p = 0; p < kPasses; ++p) {
          cp_async16(dst + dst_off[p % kPeriod] + (p / kPeriod) * 8 * C::kKvRowBytes, src + p * kStep * C::kKvRowBytes,
                     16u);
        }
        if (lane < kPage * 4 / 16) {
          cp_async16(scales + stage * C::kScaleBytes + w * kPage * 4 + lane * 16, blk + kScaleOffset + lane * 16, 16u);
        }
      }
    }
    cp_async_arrive(full + stage * 8);
  });
  asm volatile("cp.async.wait_all;" ::: "memory");
}

#endif  // DSA_SM90_INDEXER_DEVICE

// kBulk: the page loader (bulk copies into plain rows, or cp.async into swizzled rows); kWgProducer: a
// producer warpgroup and setmaxnreg (Cfg); kTma (with both, fp8 MMAs at N = 128): each page's values one TMA
// box of kv_map into swizzled rows, read by the MMAs from shared memory (no A fragments in registers), Q in
// natural D order. kv_map is unused without kTma. See the top.
template <int kMode, int kHeads, int kRows, int kWgs, bool kBulk, bool kWgProducer = false, bool kTma = false>
__global__ void __launch_bounds__(Cfg<kMode, kHeads * kRows, kWgs, kWgProducer>::kThreads, 1)
    paged_indexer_logits_kernel(const __grid_constant__ CUtensorMap kv_map, const __grid_constant__ KernelArgs a) {
#if DSA_SM90_INDEXER_DEVICE
  static_assert(!kTma || (kBulk && kWgProducer && kMode == kFp8Mma && kHeads * kRows == 128),
                "TMA pages with A from shared memory: the producer-warpgroup kernels' fp8 MMAs at N = 128");
  static_assert(kWgs != 4 || kTma || kHeads * kRows <= 64, "4 math warpgroups: A in registers fits N <= 64 only");
  constexpr int kN = kHeads * kRows;
  using C = Cfg<kMode, kN, kWgs, kWgProducer>;
  constexpr int kTileKeys = C::kTileKeys;
  constexpr int kMathThreads = C::kMathThreads;
  extern __shared__ uint8_t smem_raw[];
  uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  asm volatile("" : "+r"(base));  // kept in a register, not rebuilt from the CTA's shared window every tile
  const uint32_t q_smem = base;
  const uint32_t stages = base + C::kQBytes;
  const uint32_t scales = stages + C::kStages * C::kStageBytes;
  const uint32_t full = scales + C::kStages * C::kScaleBytes;
  const uint32_t empty = full + C::kStages * 8;

  // kBulk: `full` completes on the producer's one arrival plus the bytes of the stage's bulk copies.
  init_stage_barriers<C::kStages, kMathThreads, kBulk ? 1 : 32>(full, empty);
  pdl_wait();
  // No early pdl_launch_dependents: this grid's CTAs end over ~50 us, and an early launch packs the
  // top-k's CTAs onto the SMs freed first (layer step, H100 b64 s_q2: 449.4 -> 443.0 us without it
  // here and in the top-k kernels).

  const int warp = threadIdx.x >> 5;
  const auto produce = [&] {
    if constexpr (kBulk) {
      if constexpr (kTma) {
        if (a.num_blocks > 0) {  // else the map is not encoded (and no page is read)
          smxx::prefetch_tensormap(&kv_map);
        }
      }
      producer_bulk<kMode, kHeads, kRows, kWgs, kWgProducer, kTma>(a, &kv_map, stages, scales, full, empty);
    } else {
      producer<kMode, kHeads, kRows, kWgs, kWgProducer>(a, stages, scales, full, empty);
    }
  };
  if constexpr (kWgProducer) {
    // One branch from the setmaxnreg to the exit: code reached at both register counts made ptxas
    // spill (8-128 bytes).
    if (warp >= C::kProducerWarp) {
      setmaxnreg_dec<C::kProducerRegs>();  // the producer warpgroup gives its registers away
      if (warp == C::kProducerWarp) {      // the other 3 warps idle
        produce();
      }
      return;
    }
    setmaxnreg_inc<C::kMathRegs>();
  } else if (warp == C::kProducerWarp) {
    produce();
    return;
  }

  const int lane = threadIdx.x & 31;
  const int c = lane & 3;  // accumulator column pair
  const int wg = __shfl_sync(0xffffffffu, warp, 0) >> 2;  // warp-uniform
  int kr0 = wg * kWgKeys + (warp & 3) * 16 + (lane >> 2);  // this thread's two keys in a tile
  asm volatile("" : "+r"(kr0));  // kept, not rebuilt from the thread index every tile
  const int kr1 = kr0 + 8;
  const float kNegInf = __int_as_float(int(0xff800000u));
  const uint64_t q_desc = sw128_desc(q_smem);

  float acc[kN / 2];
  float w[kN / 4];
  uint32_t stage = 0, phase = 0;
  int32_t staged_rb = -1;  // the row block whose Q tile and weights are loaded
  ItemPipeline<kRows, kWgs> pipe(a, lane);
  Item<kRows> t;
  int32_t rb, ids[2];
  while (pipe.take(a, lane, t, rb, ids)) {
    if (rb != staged_rb) {  // CTA-uniform: a new Q tile (few requests: a CTA keeps its row block)
      staged_rb = rb;
      math_barrier<kMathThreads>();  // every warpgroup's MMAs on the previous Q tile have completed
      if (threadIdx.x < 2 * kN) {  // two threads per Q row n = r * H + h
        const int n = threadIdx.x >> 1;
        const int r = n / kHeads;
        const uint8_t* src = a.q + int64_t(t.b) * a.q_batch_stride + int64_t(t.i0 + r) * a.q_token_stride +
                             int64_t(n % kHeads) * a.q_head_stride;
        if constexpr (kTma) {
          stage_q_row_natural(r < t.ntok, src, n, threadIdx.x & 1, q_smem);
        } else {
          stage_q_row<kMode, kN>(r < t.ntok, src, n, threadIdx.x & 1, q_smem);
        }
      }
#pragma unroll
      for (int i = 0; i < kN / 8; ++i) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = 8 * i + 2 * c + e;
          const int r = col / kHeads;
          w[2 * i + e] = r < t.ntok ? __ldg(a.weights + (t.row0 + r) * a.w_row_stride +
                                            (col % kHeads) * a.w_head_stride)
                                    : 0.f;
        }
      }
      // Generic-proxy stores of Q must be visible to the MMA's async-proxy reads.
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      math_barrier<kMathThreads>();
    }

    if (a.clean) {  // positions of the chunk past the computed tiles: -inf, no math
      const int32_t kz = min(t.t1 * kTileKeys, t.k_end);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r < t.ntok) {
          fill_neg_inf<kMathThreads>(a.out + (t.row0 + r) * a.out_row_stride, kz, t.k_end);
        }
      }
    }

    // Where this thread stores, set once per item: all its values are in row c % kRows (kRows 2 or 4), or
    // (kRows 1) lane c < 2 stores key kr0, c >= 2 key kr1, from the even lane.
    const int my_r = c % kRows;
    float* const row_out = kRows == 1 || my_r < t.ntok ? a.out + (t.row0 + my_r) * a.out_row_stride : nullptr;
    const int32_t row_hi = row_value(t.hi, my_r);
    const int32_t my_kr = kRows == 1 ? (c < 2 ? kr0 : kr1) : kRows == 2 ? kr0 + 8 * ((c & 3) >> 1) : kr0;
    for (int32_t tile = t.t0; tile < t.t1; ++tile) {
      const int32_t key0 = tile * kTileKeys;
      // This warpgroup's block id (-1 for a page past the last visible position: masked by mask_pages).
      const int32_t id = page_id(ids, kWgs * (tile - t.t0) + wg);
      const bool page_ok = id >= 0 && id < a.num_blocks;
      mbar_wait(full + stage * 8, phase);
      float s0 = 0.f, s1 = 0.f;  // a page not copied holds stale data: its scores are -inf below
      if (page_ok) {
        s0 = __uint_as_float(lds32(scales + stage * C::kScaleBytes + kr0 * 4));
        s1 = __uint_as_float(lds32(scales + stage * C::kScaleBytes + kr1 * 4));
      }
      float part[2 * kRows];
      const uint32_t tile_smem = stages + stage * C::kStageBytes;
      const uint32_t empty_bar = empty + stage * 8;
      if (++stage == uint32_t(C::kStages)) {
        stage = 0;
        phase ^= 1u;
      }
      if constexpr (kTma) {
        // The warpgroup's page as A from shared memory; the stage is released once its MMAs completed. Q's
        // descriptor rebuilt from the base, not held across the loop (4 warpgroups: 112 registers).
        mma_tile_ss(acc, sw128_desc(tile_smem + uint32_t(wg * kPageBytes)), sw128_desc(q_smem));
        mbar_arrive(empty_bar);
        head_sums_by_sign<kHeads, kN, true>(acc, w, s0, s1, part);
      } else if constexpr (kBulk) {
        score_tile_rows<kMode, kHeads, kN>(tile_smem, kr0, kr1, c, empty_bar, q_desc, acc, w, s0, s1, part);
      } else {
        score_tile<kMode, kHeads, kN>(tile_smem, kr0, kr1, c, empty_bar, q_desc, acc, w, s0, s1, part);
      }
      if constexpr (kRows == 1) {
        // Lanes c = 0, 1 hold key kr0's total, c = 2, 3 key kr1's; the even lane stores.
        const float total = quad_reduce_pair(part, c);
        const int32_t key = key0 + my_kr;
        if ((c & 1) == 0 && key < a.width) {
          row_out[key] = page_ok && key < row_hi ? total : kNegInf;
        }
      } else {
        float total[2 * kRows / 4];
        quad_reduce_scatter<2 * kRows>(part, c, total);
        // 4 math warpgroups at N = 128 rebuild the row pointer here: held across the tile loop, it spilled 4
        // bytes at 112 registers.
        float* const out_row = kTma && kWgs == 4
                                   ? (my_r < t.ntok ? a.out + (t.row0 + my_r) * a.out_row_stride : nullptr)
                                   : row_out;
        // Lane c stores value 4 b + c = (key half (4 b + c) / kRows, row c % kRows).
#pragma unroll
        for (int b = 0; b < 2 * kRows / 4; ++b) {
          const int32_t key = key0 + my_kr + 8 * b;
          if (out_row != nullptr && key < a.width) {
            out_row[key] = page_ok && key < row_hi ? total[b] : kNegInf;
          }
        }
      }
    }
  }
#endif  // DSA_SM90_INDEXER_DEVICE
}

}  // namespace sm90_paged_indexer
}  // namespace dsa_cuda
