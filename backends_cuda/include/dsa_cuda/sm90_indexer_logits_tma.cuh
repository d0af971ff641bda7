// dsa.indexer_logits on Hopper (sm_90a), TMA kernel: IndexerLogitsParams::config 1 (4 math warpgroups)
// and 2 (3), fp8 operands in the fp8-MMA mode; the launcher's default there (4 warpgroups). Config 4 is
// the same kernel in the exact mode (precise=True, fp8 operands), the launcher's default there: 3 math
// warpgroups read their key rows from the stage into registers, widen e4m3 to fp16 there and run fp16
// MMAs with A from registers (see "Exact mode" below). Every other mode runs the cp.async kernel,
// sm90_indexer_logits.cuh (config 3).
//
// H100, 4096 rows, H 64, interleaved processes beside DeepGEMM (benchmarks/results/
// h100_indexer_scales_tma_593fd98.log): 32768 keys full 1900-1941 us (DeepGEMM 2134-2193), 131072 full 8049-8060
// (9301-9351): 0.86-0.91x DeepGEMM's time since the key scales come by TMA (below), 0.99-1.02x before.
// What bounds it is issue and latency, not memory: ncu at 32768 keys, 259 warp
// instructions a 64-key tile (4 MMAs, 64 relu, 64 weight FMAs; the rest addresses, scales, quad sums, the
// store) against DeepGEMM's 246; stalls: waiting on the MMAs 18% of samples, on the key-scale loads 9%.
// Keeping in the tile loop only what changes per tile (descriptors from warp-uniform values, the item's
// score slots set once, a stage/phase count) cut 3-warpgroup tiles from 279 to 245 instructions and took 4
// warpgroups from 2491 to 2184 us at 32768 keys full (same run); holding the smem base and the key row in
// registers took 14 more a tile (4 warpgroups, H 64: 113 -> 99 beside the 128 relu / FMA), 2364 -> 2275 us
// (interleaved, tools/ab_indexer_logits.py).
//
// Same items, windows, tile skipping, epilogue and stores as the cp.async kernel; what differs is how a
// key tile reaches the tensor cores and how many warpgroups share an SM:
// - Producer warpgroup (setmaxnreg down to 32): one thread issues one TMA copy
//   (cp.async.bulk.tensor.2d) of a 256-key x 128-byte box a stage, 128-byte swizzle, and one of the stage's
//   256 fp32 key scales (a 1-D box of kv_scale), after expect_tx on the stage's full mbarrier. Rows and
//   scales past N are zero-filled by the TMA unit (no tail path).
// - 4 math warpgroups (setmaxnreg up to 112): warpgroup w takes keys [64w, 64w + 64) of the stage as the
//   MMA's A through a shared-memory descriptor (wgmma SS: the box lands in the K-major 128-byte-swizzle
//   layout the descriptor reads), Q as B in natural D order; one arrival a warp releases the stage once
//   its MMAs complete. The item's weights and windows stay in registers; the key scales are read from the
//   stage. Loaded from global memory as before, they stalled every tile: the wgmma fence waits for all of
//   the warp's loads in flight, and ptxas hoists the scale loads above it wherever the source puts them
//   (ncu, H100, 4096 x 32768: 21.7% of the stall samples on WARPGROUP.ARRIVE, long scoreboard).
//   H100: 0.86-0.91x DeepGEMM at H 64 (0.99-1.02x before), 0.93x at H 32 (0.96-0.99x). kv_scale
//   must be contiguous and 16-byte aligned for the tensor map: otherwise the launcher's default runs the
//   cp.async kernel and configs 1 and 2 refuse.
//
// Why (docs/design_indexer.md): the cp.async kernel is 1.26-1.47x DeepGEMM's time on the H200 (fp8, 4096
// rows, H 64); ncu: 9 warps an SM, IPC 1.80, 43.5% of issue slots, against DeepGEMM's 17 warps (TMA
// producer + 4 math warpgroups), IPC 2.22. The 3-4 warpgroup variants measured before were 1.33-1.45x
// slower with one cp.async warp filling 192-256-key stages and the weights and windows read from shared
// memory every tile; here the copy is one instruction a stage and nothing per tile comes from shared
// memory but the MMA operands.
//
// Exact mode (config 4): the cp.async kernel's fp16 path (score_tile's pieces in sm90_indexer_core.cuh) on
// this pipeline. The TMA box lands rows exactly where the cp.async producer puts them (128-byte rows, 16-byte
// chunk j of row n at chunk j ^ (n % 8)), so load_a_fragments reads them unchanged, and Q is staged with the
// core's D permutation (stage_q_row); same MMA sequence, same epilogue: scores bitwise those of config 3 in
// the exact mode. Why: config 3 reaches 58-64% of the bf16 matmul rate (2 math warpgroups beside a cp.async
// warp), Triton 70-83%; per 192-key stage here the fp16 MMAs take about 3 x 512 tensor cycles against about
// 260 issue cycles of epilogue a warpgroup, so 3 warpgroups keep the tensor pipe the bound. Prediction
// (H200, 4096 x 32768, H 64): 4395 us (config 3) -> 3000-3400 us, 650-730 TFLOP/s. 4 warpgroups do not fit:
// 64 accumulators, 32 weights and 32 A registers exceed 112.
//
// Registers: 640 threads start at 96 (the launch bound), so the CTA's setmaxnreg pool is 61440;
// 128 x 32 + 512 x 112 = 61440. A producer at 40 would leave 104 a math thread, while the 64
// accumulators and 32 weights alone take 96. Config 2 is the same kernel with 3 math warpgroups (192-key
// stages, producer 40, math 152).
//
// Torch-free. Included by indexer_logits.cuh under __CUDACC__.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include <cstdint>

#include "common_launch.cuh"
#include "smxx_tma.cuh"
#include "sm90_indexer_core.cuh"
#include "sm90_indexer_logits.cuh"

namespace dsa_cuda {
namespace sm90_indexer {

// kWgs math warpgroups: 4 (config 1) or 3 (config 2, the same kernel with 192-key stages, to tell the
// fourth warpgroup's worth apart from TMA's in one sweep); kMode kFp8Mma (A from shared memory) or
// kFp8AsF16 (config 4: 3 warpgroups, A from registers widened to fp16, Q staged as fp16).
template <int kWgs_, int kMode_ = kFp8Mma>
struct TmaCfg {
  static constexpr int kWgs = kWgs_;
  static constexpr int kMode = kMode_;
  static_assert(kWgs == 3 || kWgs == 4, "3 or 4 math warpgroups");
  static_assert(kMode == kFp8Mma || (kMode == kFp8AsF16 && kWgs == 3), "fp8 MMAs, or fp16 with 3 warpgroups");
  static constexpr int kMathThreads = 128 * kWgs;
  static constexpr int kThreads = kMathThreads + 128;  // + the producer warpgroup
  static constexpr int kTileKeys = kWgKeys * kWgs;     // keys a stage: the TMA box's rows (at most 256)
  static constexpr int kRowBytes = kDim;               // e4m3 key row: the box's 128-byte inner extent
  static constexpr int kStageBytes = kTileKeys * kRowBytes;  // a multiple of 1024 (swizzle atoms)
  // 6 x 32 KB or 8 x 24 KB, + Q 16 KB (fp16: 32 KB): one more passes 227 KB.
  static constexpr int kStages = kWgs == 4 ? 6 : 8;
  static constexpr int kQBytes = kN * ModeTraits<kMode>::kQRowBytes;
  // fp8 MMAs: the stage's key scales (fp32) come with it by TMA (a 1-D box of kv_scale) and are read from
  // shared memory. Global loads there made the wgmma fence wait for them (see the tile loop).
  static constexpr int kScaleBytes = kMode == kFp8Mma ? kTileKeys * 4 : 0;
  static constexpr int kSmemBytes = 1024 + kQBytes + kStages * (kStageBytes + kScaleBytes) + 2 * kStages * 8;
  static constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8;  // the launch bound's registers: 96 or 128
  // 4: 128 x 32 + 512 x 112 = 61440 (a producer at 40 would leave 104, below the 96 accumulator and
  // weight registers plus the loop state); 3: 128 x 40 + 384 x 152 = 63488 of 65536.
  static constexpr int kProducerRegs = kWgs == 4 ? 32 : 40;
  static constexpr int kMathRegs = kWgs == 4 ? 112 : 152;
  static_assert(128 * kProducerRegs + kMathThreads * kMathRegs <= kThreads * kLaunchRegs,
                "setmaxnreg asks for more registers than the CTA starts with");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

#if DSA_SM90_INDEXER_DEVICE

using smxx::prefetch_tensormap;  // smxx_tma.cuh
using smxx::tma_load_1d;
using smxx::tma_load_2d;
using smxx::ldg_if;  // smxx_memory.cuh

// The item's Q tile as the MMA's B: row n = r * H + h, 128 bytes in natural D order (A is not
// permuted here: the tensor core reads the keys as TMA stored them), 128-byte swizzle. The math threads
// copy its 1024 16-byte chunks in turn (i: row i / 8, chunk i % 8).
template <int kHeads, int kMathThreads>
__device__ __forceinline__ void stage_q_natural(const KernelArgs& a, int64_t row0, uint32_t q_smem) {
  for (int i = threadIdx.x; i < kN * 8; i += kMathThreads) {
    const int n = i >> 3;
    const int j = i & 7;
    const int64_t row = row0 + n / kHeads;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (row < a.rows) {
      x = __ldg(reinterpret_cast<const uint4*>(a.q + row * a.q_row_stride + (n % kHeads) * a.q_head_stride) + j);
    }
    sts128(q_smem + n * 128 + ((j ^ (n & 7)) << 4), x);
  }
}

// One thread: every tile of the CTA's items, in the math warps' order, one TMA copy a stage (and with fp8 MMAs
// a second, of the stage's key scales from scale_map).
template <class C, int kHeads>
__device__ __forceinline__ void tma_producer(const KernelArgs& a, const CUtensorMap* map, const CUtensorMap* scale_map,
                                             uint32_t stages, uint32_t scales, uint32_t full, uint32_t empty) {
  constexpr int kRows = kN / kHeads;
  uint32_t it = 0;
  for (TailSplitCursor cur; cur.valid(a); cur.next()) {
    const Item<kRows> t = cur.decode<kRows, C::kTileKeys>(a);
    for (int32_t tile = t.t0; tile < t.t1; ++tile, ++it) {
      const uint32_t stage = it % C::kStages;
      if (it >= uint32_t(C::kStages)) {  // every math warp has finished its MMAs on the previous use
        mbar_wait(empty + stage * 8, ((it / C::kStages) - 1) & 1);
      }
      // A box past N still counts all its bytes (zero-filled).
      mbar_arrive_expect_tx(full + stage * 8, C::kStageBytes + C::kScaleBytes);
      tma_load_2d(stages + stage * C::kStageBytes, map, 0, tile * C::kTileKeys, full + stage * 8);
      if constexpr (C::kScaleBytes > 0) {
        tma_load_1d(scales + stage * C::kScaleBytes, scale_map, tile * C::kTileKeys, full + stage * 8);
      }
    }
  }
}

// Where this thread stores its quad-reduced scores of an item, set once per item so that a tile costs a
// compare and a store per value. Value b of quad_reduce_scatter is (key half (4 b + c) / kRows, row
// (4 b + c) % kRows): with kRows 2 or 4 every value of a thread is in row c % kRows.
template <int kRows>
struct ScoreSlots {
  static_assert(kRows == 2 || kRows == 4, "64 or 32 heads");
  static constexpr int kSlots = 2 * kRows / 4;
  float* row_out;  // the row's first score; null for a row past T (nothing is stored)
  int32_t lo, hi;  // the row's window
  int32_t kr;       // key of value 0 within a stage (kr0 or kr1 = kr0 + 8); value b's is kr + 8 b

  __device__ __forceinline__ ScoreSlots(const KernelArgs& a, const Item<kRows>& t, int c, int kr0) {
    const int r = c % kRows;
    const int64_t row = t.row0 + r;
    row_out = row < a.rows ? a.out + row * a.out_row_stride : nullptr;
    lo = row_value(t.lo, r);
    hi = row_value(t.hi, r);
    kr = kr0 + (kRows == 4 ? 0 : 8 * ((c & 3) / kRows));
  }

  // The tile's scores (part: this thread's head sums before the quad reduction), -inf outside the window.
  __device__ __forceinline__ void store(const KernelArgs& a, const float (&part)[2 * kRows], int c,
                                        int32_t key0) const {
    const float kNegInf = __int_as_float(int(0xff800000u));
    float total[kSlots];
    quad_reduce_scatter<2 * kRows>(part, c, total);
#pragma unroll
    for (int b = 0; b < kSlots; ++b) {
      const int32_t key = key0 + kr + 8 * b;
      if (row_out != nullptr && key < a.keys) {
        row_out[key] = key >= lo && key < hi ? total[b] : kNegInf;
      }
    }
  }
};

#endif  // DSA_SM90_INDEXER_DEVICE

// kv_map: the keys as a [N, 128] uint8 tensor, box [TmaCfg::kTileKeys rows, 128 bytes], 128-byte
// swizzle, zero fill (the launcher builds it).
template <int kWgs, int kHeads, int kMode = kFp8Mma>
__global__ void __launch_bounds__(TmaCfg<kWgs, kMode>::kThreads, 1)
    indexer_logits_tma_kernel(const __grid_constant__ CUtensorMap kv_map, const __grid_constant__ CUtensorMap scale_map,
                              const __grid_constant__ KernelArgs a) {
#if DSA_SM90_INDEXER_DEVICE
  using C = TmaCfg<kWgs, kMode>;
  constexpr int kTileKeys = C::kTileKeys;
  constexpr int kMathThreads = C::kMathThreads;
  constexpr int kRows = kN / kHeads;
  extern __shared__ uint8_t smem_raw[];
  uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  // Opaque to ptxas, so kept in a register: otherwise it rebuilds it from the CTA's shared window every
  // tile (5 instructions).
  asm volatile("" : "+r"(base));
  const uint32_t q_smem = base;
  const uint32_t stages = base + C::kQBytes;
  const uint32_t scales = stages + C::kStages * C::kStageBytes;  // fp8 MMAs: each stage's key scales
  const uint32_t full = scales + C::kStages * C::kScaleBytes;
  const uint32_t empty = full + C::kStages * 8;

  // full: the producer's one expect_tx arrival; empty: one arrival a math warp.
  init_stage_barriers<C::kStages, kMathThreads / 32, 1>(full, empty);
  pdl_wait();
  pdl_launch_dependents();

  const int warp = threadIdx.x >> 5;
  if (warp >= kMathThreads / 32) {
    setmaxnreg_dec<C::kProducerRegs>();
    if (threadIdx.x == kMathThreads) {
      prefetch_tensormap(&kv_map);
      if constexpr (C::kScaleBytes > 0) {
        prefetch_tensormap(&scale_map);
      }
      tma_producer<C, kHeads>(a, &kv_map, &scale_map, stages, scales, full, empty);
    }
    return;
  }
  setmaxnreg_inc<C::kMathRegs>();

  const int lane = threadIdx.x & 31;
  const int c = lane & 3;  // accumulator column pair
  // Warp-uniform (a shuffle from lane 0), so the MMA descriptors are computed in uniform registers.
  const int wg = __shfl_sync(0xffffffffu, warp, 0) >> 2;
  int kr0 = wg * kWgKeys + (warp & 3) * 16 + (lane >> 2);  // this thread's two keys in a stage
  asm volatile("" : "+r"(kr0));  // kept, not rebuilt from the thread index every tile (9 instructions)
  const int kr1 = kr0 + 8;
  const uint64_t q_desc = sw128_desc(q_smem);
  // Stage 0's descriptor of the warpgroup's 64 rows (1024-aligned); stage s is s x kStageBytes further.
  const uint64_t a_desc0 = sw128_desc(stages + uint32_t(wg * kWgKeys * C::kRowBytes));

  float acc[64];
  float w[32];
  uint32_t stage = 0, phase = 0;
  for (TailSplitCursor cur; cur.valid(a); cur.next()) {
    const Item<kRows> t = cur.decode<kRows, kTileKeys>(a);
    math_barrier<kMathThreads>();  // every warpgroup's MMAs on the previous Q tile have completed
    if constexpr (kMode == kFp8Mma) {
      stage_q_natural<kHeads, kMathThreads>(a, t.row0, q_smem);
    } else if (threadIdx.x < 2 * kN) {
      stage_q<kMode, kHeads>(a, t.row0, q_smem);  // D permuted to match load_a_fragments, widened to fp16
    }
    load_item_weights<kHeads>(a, t.row0, c, w);
    // Generic-proxy stores of Q must be visible to the MMA's async-proxy reads.
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    math_barrier<kMathThreads>();

    if (a.clean) {
      fill_outside_tiles<kRows, kTileKeys, kMathThreads>(a, t);
    }

    // The score slots are the item's; the exact mode rebuilds its scale address per tile (a pointer stepped
    // instead took two more registers, which spilled the 4-warpgroup instances at 112 when they loaded scales).
    const ScoreSlots<kRows> slots(a, t, c, kr0);
    for (int32_t tile = t.t0; tile < t.t1; ++tile) {
      const int32_t key0 = tile * kTileKeys;
      float s0, s1;  // 0 past N (scores not stored)
      if constexpr (kMode == kFp8Mma) {
        // The scales from the stage: global loads here stalled the wgmma fence (the header's math warpgroups).
        mbar_wait(full + stage * 8, phase);
        s0 = __uint_as_float(lds32(scales + stage * C::kScaleBytes + kr0 * 4));
        s1 = __uint_as_float(lds32(scales + stage * C::kScaleBytes + kr1 * 4));
        mma_tile_ss(acc, a_desc0 + uint64_t(stage * (C::kStageBytes >> 4)), q_desc);
      } else {
        const float* scale = a.kv_scale + int64_t(key0 + kr0) * a.kv_scale_stride;
        s0 = ldg_if(key0 + kr0 < a.keys, scale);
        s1 = ldg_if(key0 + kr1 < a.keys, scale + 8 * a.kv_scale_stride);
        mbar_wait(full + stage * 8, phase);
        uint32_t fa[ModeTraits<kMode>::kSteps][4];
        load_a_fragments<kMode>(stages + stage * C::kStageBytes, kr0, kr1, c, fa);
        mma_tile<kMode, kN>(acc, fa, q_desc);
      }
      if (lane == 0) {  // this warp's share of the MMAs has completed: the stage may be refilled
        mbar_arrive(empty + stage * 8);
      }
      if (++stage == uint32_t(C::kStages)) {
        stage = 0;
        phase ^= 1u;
      }
      float part[2 * kRows];
      head_sums_by_sign<kHeads, kN, kMode == kFp8Mma && kWgs == 4>(acc, w, s0, s1, part);
      slots.store(a, part, c, key0);
    }
  }
#endif  // DSA_SM90_INDEXER_DEVICE
}

}  // namespace sm90_indexer
}  // namespace dsa_cuda
