// dsa.indexer_logits on Hopper (sm_90a): warpgroup MMA, warp-specialised, persistent.
//
// Work: an item is (R query rows, a chunk of key tiles), R = 128 / H, so a Q tile of R rows x H heads
// is the MMA's N = 128. Items are ordered chunk-major, so the CTAs running at one time share their
// keys in L2. A persistent grid (one CTA per SM) strides over the items.
//
// CTA: 2 math warpgroups + 1 producer warp.
// - The producer streams 128-key tiles of kv into a ring of shared-memory stages with cp.async
//   (16-byte chunks, 128-byte XOR swizzle, zero fill past N); each stage has a "full" mbarrier (its 32
//   lanes arrive when their copies land) and an "empty" one (the 256 math threads arrive once they
//   hold the tile in registers).
// - Math warpgroup w takes keys [64w, 64w + 64) of each tile as the MMA's M: it reads its A fragment
//   from the stage straight into registers (fp8 is widened to fp16 there), and B, the Q tile, from
//   shared memory through a wgmma descriptor (128-byte swizzle, K-major). Accumulator [64 keys, 128]
//   fp32; the epilogue applies relu and the head weights (in registers), sums heads across the quad
//   with xor shuffles, applies the key scale and stores fp32 scores (-inf outside the row's window).
// - The depth axis D is permuted identically in A and B (a dot product does not care about order) so
//   that each thread's A fragment for all k-steps is 32 contiguous bytes of its key row.
// - Key tiles outside the hull of the item's windows are not loaded or multiplied; their scores are
//   written -inf directly when `clean`.
//
// 2 math warpgroups with A from registers: on the H200 (fp8 MMA, 4096 rows) 3 or 4 warpgroups were
// 1.33-1.45x slower, and A read by the tensor core from the stage (2 warpgroups) 1% faster to 7% slower
// (docs/design_indexer.md, "Tried" under the dense fp8 mode).
//
// Operand modes: kFp8AsF16 (default for fp8: e4m3 widened to fp16 exactly, fp16 MMA with fp32
// accumulation, meets the 1e-5 contract), kFp8Mma (e4m3 MMA: 2x the rate, ~14-bit accumulation inside
// the tensor core), kBf16.
//
// The scoring core (A fragments, MMA, head reduction) is sm90_indexer_core.cuh, shared with
// paged_indexer_logits so both compute scores with the same arithmetic.
//
// Torch-free. Included by indexer_logits.cuh under __CUDACC__.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common_launch.cuh"
#include "sm90_indexer_core.cuh"


namespace dsa_cuda {
namespace sm90_indexer {

template <int kMode>
struct Cfg {
  static constexpr int kWgs = 2;                      // math warpgroups
  static constexpr int kMathThreads = 128 * kWgs;
  static constexpr int kThreads = kMathThreads + 32;  // + the producer warp
  static constexpr int kProducerWarp = kMathThreads / 32;
  static constexpr int kTileKeys = kWgKeys * kWgs;    // keys per pipeline stage
  static constexpr int kKvRowBytes = ModeTraits<kMode>::kKvRowBytes;
  static constexpr int kKvChunks = ModeTraits<kMode>::kKvChunks;
  static constexpr int kStageBytes = kTileKeys * kKvRowBytes;
  static constexpr int kStages = kMode == kBf16 ? 4 : 6;
  static constexpr int kQRowBytes = ModeTraits<kMode>::kQRowBytes;  // operand bytes per Q row
  static constexpr int kQBytes = kN * kQRowBytes;
  // 1024 of slack: the swizzled tiles must start 1024-aligned in the shared window. Then Q, the
  // stages and the full / empty barriers.
  static constexpr int kSmemBytes = 1024 + kQBytes + kStages * kStageBytes + 2 * kStages * 8;
};

#if DSA_SM90_INDEXER_DEVICE


template <int kMode, int kHeads>
__device__ __forceinline__ void producer(const KernelArgs& a, uint32_t stages, uint32_t full, uint32_t empty) {
  using C = Cfg<kMode>;
  constexpr int kTileKeys = C::kTileKeys;
  constexpr int kRows = kN / kHeads;
  // A lane always copies the same 16-byte column `ch` of rows r0, r0 + kStep, ... : the swizzled
  // destination repeats every 8 rows, so every copy's address is a base plus a constant.
  constexpr int kStep = 32 / C::kKvChunks;        // rows per pass of the warp
  constexpr int kPasses = kTileKeys / kStep;
  constexpr int kPeriod = 8 / kStep;              // passes per 8 rows (one swizzle period)
  const int lane = threadIdx.x & 31;
  const int ch = lane % C::kKvChunks;
  const int r0 = lane / C::kKvChunks;
  uint32_t dst_off[kPeriod];
#pragma unroll
  for (int p = 0; p < kPeriod; ++p) {
    const int r = r0 + p * kStep;
    dst_off[p] = uint32_t(r * C::kKvRowBytes + ((ch ^ (r & 7)) << 4));
  }
  const int64_t pass_stride = int64_t(kStep) * a.kv_row_stride;
  const uint8_t* lane_src = a.kv + int64_t(r0) * a.kv_row_stride + ch * 16;
  uint32_t it = 0;
  for (ItemCursor cur(a); cur.valid(a); cur.next(a)) {
    const Item<kRows> t = decode_item<kRows, C::kTileKeys>(a, cur.rb, cur.kc);
    for (int32_t tile = t.t0; tile < t.t1; ++tile, ++it) {
      const uint32_t stage = it % C::kStages;
      if (it >= uint32_t(C::kStages)) {  // wait until the math warps have taken the previous use
        mbar_wait(empty + stage * 8, ((it / C::kStages) - 1) & 1);
      }
      const uint32_t dst = stages + stage * C::kStageBytes;
      const int32_t key0 = tile * kTileKeys;
      const uint8_t* src = lane_src + int64_t(key0) * a.kv_row_stride;
      if (key0 + kTileKeys <= a.keys) {
#pragma unroll
        for (int j = 0; j < kPasses; ++j) {
          cp_async16(dst + dst_off[j % kPeriod] + (j / kPeriod) * 8 * C::kKvRowBytes, src, 16u);
          src += pass_stride;
        }
      } else {  // the last tile: rows past N are zero-filled, never read
#pragma unroll 4
        for (int j = 0; j < kPasses; ++j) {
          const bool ok = key0 + r0 + j * kStep < a.keys;
          cp_async16(dst + dst_off[j % kPeriod] + (j / kPeriod) * 8 * C::kKvRowBytes, ok ? src : a.kv,
                     ok ? 16u : 0u);
          src += pass_stride;
        }
      }
      cp_async_arrive(full + stage * 8);
    }
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
}

// Writes the item's Q tile into shared memory as the MMA's B operand: row n = r * H + h (see
// stage_q_row in the core).
template <int kMode, int kHeads>
__device__ __forceinline__ void stage_q(const KernelArgs& a, int64_t row0, uint32_t q_smem) {
  const int tid = threadIdx.x;  // 0 .. 255: two threads per Q row, 64 of D each
  const int n = tid >> 1;
  const int half = tid & 1;
  const int64_t row = row0 + n / kHeads;
  const int h = n % kHeads;
  stage_q_row<kMode, kN>(row < a.rows, a.q + row * a.q_row_stride + h * a.q_head_stride, n, half, q_smem);
}

// This thread's 32 head weights of the item (accumulator columns 8 i + 2 c + e), 0 for rows past the last.
template <int kHeads>
__device__ __forceinline__ void load_item_weights(const KernelArgs& a, int64_t row0, int c, float (&w)[32]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = 8 * i + 2 * c + e;
      const int64_t row = row0 + col / kHeads;
      w[2 * i + e] = row < a.rows ? __ldg(a.weights + row * a.w_row_stride + (col % kHeads) * a.w_head_stride) : 0.f;
    }
  }
}

// The scales of this thread's two keys, 0 past N (their scores are not stored).
__device__ __forceinline__ void key_scales(const KernelArgs& a, int32_t key_a, int32_t key_b, float& s0, float& s1) {
  const float x0 = ldg_early(a.kv_scale + int64_t(min(key_a, a.keys - 1)) * a.kv_scale_stride);
  const float x1 = ldg_early(a.kv_scale + int64_t(min(key_b, a.keys - 1)) * a.kv_scale_stride);
  s0 = key_a < a.keys ? x0 : 0.f;
  s1 = key_b < a.keys ? x1 : 0.f;
}

// The quad's head sums of its two keys to scores: lane c stores value 4 b + c = kh * kRows + r, -inf
// outside row r's window.
template <int kRows>
__device__ __forceinline__ void store_tile_scores(const KernelArgs& a, const Item<kRows>& t, const float (&part)[2 * kRows],
                                                  int c, int32_t key_a, int32_t key_b) {
  const float kNegInf = __int_as_float(int(0xff800000u));
  float total[2 * kRows / 4];
  quad_reduce_scatter<2 * kRows>(part, c, total);
#pragma unroll
  for (int b = 0; b < 2 * kRows / 4; ++b) {
    const int v = 4 * b + (c & 3);  // c & 3: the divisions below become shifts (c is a lane's & 3)
    const int kh = v / kRows;
    const int r = v % kRows;
    const int32_t lo = row_value(t.lo, r);
    const int32_t hi = row_value(t.hi, r);
    const int64_t row = t.row0 + r;
    const int32_t key = kh ? key_b : key_a;
    if (row < a.rows && key < a.keys) {
      a.out[row * a.out_row_stride + key] = key >= lo && key < hi ? total[b] : kNegInf;
    }
  }
}

#endif  // DSA_SM90_INDEXER_DEVICE

template <int kMode, int kHeads>
__global__ void __launch_bounds__(Cfg<kMode>::kThreads, 1)
    indexer_logits_kernel(const __grid_constant__ KernelArgs a) {
#if DSA_SM90_INDEXER_DEVICE
  using C = Cfg<kMode>;
  constexpr int kTileKeys = C::kTileKeys;
  constexpr int kMathThreads = C::kMathThreads;
  constexpr int kRows = kN / kHeads;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t q_smem = base;
  const uint32_t stages = base + C::kQBytes;
  const uint32_t full = stages + C::kStages * C::kStageBytes;
  const uint32_t empty = full + C::kStages * 8;

  init_stage_barriers<C::kStages, kMathThreads, 32>(full, empty);
  pdl_wait();
  pdl_launch_dependents();

  const int warp = threadIdx.x >> 5;
  if (warp == C::kProducerWarp) {
    producer<kMode, kHeads>(a, stages, full, empty);
    return;
  }

  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;  // accumulator row within the warp's 16
  const int c = lane & 3;   // accumulator column pair
  const int kr0 = (warp >> 2) * kWgKeys + (warp & 3) * 16 + g;  // this thread's two keys in a tile
  const int kr1 = kr0 + 8;
  const uint64_t q_desc = sw128_desc(q_smem);

  float acc[64];
  float w[32];
  uint32_t it = 0;
  for (ItemCursor cur(a); cur.valid(a); cur.next(a)) {
    const Item<kRows> t = decode_item<kRows, C::kTileKeys>(a, cur.rb, cur.kc);
    math_barrier<kMathThreads>();  // every warpgroup's MMAs on the previous Q tile have completed
    if (threadIdx.x < 2 * kN) {
      stage_q<kMode, kHeads>(a, t.row0, q_smem);
    }
    load_item_weights<kHeads>(a, t.row0, c, w);
    // Generic-proxy stores of Q must be visible to the MMA's async-proxy reads.
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    math_barrier<kMathThreads>();

    if (a.clean) {
      fill_outside_tiles<kRows, kTileKeys, kMathThreads>(a, t);
    }

    for (int32_t tile = t.t0; tile < t.t1; ++tile, ++it) {
      const uint32_t stage = it % C::kStages;
      const int32_t key0 = tile * kTileKeys;
      const int32_t key_a = key0 + kr0;
      const int32_t key_b = key0 + kr1;
      float s0 = 1.f, s1 = 1.f;
      if constexpr (kMode != kBf16) {
        key_scales(a, key_a, key_b, s0, s1);
      }
      mbar_wait(full + stage * 8, (it / C::kStages) & 1);
      float part[2 * kRows];
      score_tile<kMode, kHeads, kN>(stages + stage * C::kStageBytes, kr0, kr1, c, empty + stage * 8, q_desc, acc, w,
                                    s0, s1, part);
      store_tile_scores<kRows>(a, t, part, c, key_a, key_b);
    }
  }
#endif  // DSA_SM90_INDEXER_DEVICE
}

}  // namespace sm90_indexer
}  // namespace dsa_cuda
