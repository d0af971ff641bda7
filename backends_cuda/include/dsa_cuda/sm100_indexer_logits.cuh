// dsa.indexer_logits on Blackwell (sm_100a, sm_103a, sm_107a), fp8 operands with fp8 MMAs (precise=False):
// tcgen05 MMAs with the fp32 accumulator in tensor memory. COMPILED, NOT RUN: no Blackwell GPU has executed
// this kernel, so the provider declines it unless the cuda backend is forced (providers_indexer.py).
//
// Work as the SM90 kernels' (smxx_indexer.cuh): an item is R = 128 / H query rows x a chunk of key tiles,
// the Q tile (R rows x H heads) is the MMA's N = 128; a persistent grid walks the items chunk-major.
//
// Orientation: D[128 keys x 128 columns] = K[128 x 128 B] * Q^T, one key a tensor-memory lane (M = 128,
// layout D: row = lane), column n = (row n / H, head n % H). A thread of the epilogue then holds whole
// rows of D: relu, head weights and the head sum run inside the thread, with no shuffles, and a warp
// stores 32 consecutive keys of a row.
//
// CTA: 10 warps (320 threads), one CTA an SM, roles fixed:
// - warps 0-7, the epilogue: warp w reads tensor-memory lanes 32 (w % 4) .. + 31 (a warp may only reach
//   its lane quarter, w % 4) and columns [64 (w / 4), + 64) of the accumulator: one key, 64 columns (H 64:
//   one row; H 32: two rows). Per item: the thread's 64 head weights into registers, the -inf fill outside
//   the computed tiles (clean); per tile: the key scale (a global load issued before the wait), 2 x 32
//   columns (tcgen05.ld), release of the accumulator, relu x weight summed, x scale, store.
// - warp 8, the producer (one thread): per item the Q tile by a 3-D TMA box (Q as [T][H][128] bytes,
//   zero fill past T) into one of two Q buffers; per tile a 128-key x 128-byte TMA box of kv (zero fill
//   past N) into the stage ring. Both boxes land 128-byte swizzled, the K-major layout the MMA reads.
// - warp 9, the MMA warp: allocates 256 tensor-memory columns (two accumulators of 128), and lane 0 issues
//   4 tcgen05.mma kind::f8f6f4 (K = 32 each) a tile and the commits.
//
// Barriers (8 bytes each): full[s] (1: the producer's expect_tx arrival), empty[s] (1: tcgen05.commit
// after the tile's MMAs), q_full[2] (1: expect_tx), q_empty[2] (1: commit after the item's last MMA),
// acc_full[2] (1: commit), acc_empty[2] (8: one arrival an epilogue warp).
// The waits, each needed:
// - the MMAs of tile i wait full[i % S] (its keys landed), q_full of the item (its Q landed) and
//   acc_empty[i % 2] for i >= 2 (the epilogue read accumulator i - 2 out).
// - the producer's load of tile i waits empty[i % S] for i >= S (the MMAs of tile i - S read the stage);
//   its load of item j's Q waits q_empty[j % 2] for j >= 2 (the MMAs of item j - 2 completed).
// - the epilogue of tile i waits acc_full[i % 2] (its MMAs completed).
//
// tcgen05 review (PTX ISA 9.x, section 9.7.16; the kind::f16 review of the same wrappers is in
// sm100_sparse_mla_decode.cuh):
// - tcgen05.mma.cta_group::1.kind::f8f6f4 [d], a_desc, b_desc, idesc, p: A and B from shared memory
//   descriptors, K = 32 for 8-bit types; shapes for cta_group::1 dense: M = 128 with N % 16 == 0 in
//   16..256 (here 128 x 128). enable-input-d p = 0 on a tile's first k-step zeroes nothing: D is
//   overwritten, so no tensor-memory clearing is needed.
// - Instruction descriptor (9.7.16.4.2, table "Instruction descriptor format for .kind::tf32, .kind::f16,
//   .kind::f8f6f4 and .kind::i8"): bits 4-5 dtype F32 = 1, 7-9 atype E4M3 = 0, 10-12 btype E4M3 = 0,
//   13/14 no negate, 15/16 no transpose (both K-major), 17-22 N >> 3 = 16, 24-28 M >> 4 = 8; sparsity,
//   saturate, reserved and max shift 0.
// - Shared memory descriptors: sm100's SWIZZLE_128B K-major (umma_desc, sm100_tcgen05.cuh: layout type 2
//   in bits 61-63, the fixed 0b001 in bits 46-48, SBO 1024 between 8-row groups, LBO unused). Both
//   operands are 128-byte rows (128 e4m3 of D) in 1024-aligned buffers; k-step s starts 32 s bytes into
//   the atom's rows (the start address field), as the SM90 wgmma k-steps do.
// - Tensor memory: tcgen05.alloc of 256 columns (a power of two >= 32) by warp 9, relinquish_alloc_permit
//   right after (one CTA an SM); tcgen05.dealloc by warp 9 after a CTA barrier that follows every
//   epilogue load (fenced with tcgen05.fence::before_thread_sync / after_thread_sync). Address: lane in
//   bits 16-31, column in bits 0-15; accumulator b at column 128 b.
// - tcgen05.ld.sync.aligned.32x32b.x32.b32: thread t of warp w reads lane 32 (w % 4) + t, 32 consecutive
//   columns; the address's lane field is 32 (w % 4). tcgen05.wait::ld before the registers are used.
// - tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64: one arrival once every earlier
//   tcgen05.mma of the thread completed (so it tracks the tile's MMAs and, for q_empty, the item's).
// - tcgen05.fence::after_thread_sync after the mbarrier waits that precede tcgen05 ops (MMA issue, ld);
//   tcgen05.fence::before_thread_sync before the acc_empty arrival that follows the loads.
// - The TMA writes are async-proxy writes the MMA (async proxy) reads after the mbarrier completes: no
//   proxy fence is needed between them.
//
// Shared memory: 1 KiB alignment slack + 2 Q buffers of 16 KiB + 8 stages of 16 KiB + 24 mbarriers (full /
// empty a stage, q_full / q_empty and acc_full / acc_empty a buffer) + the tensor memory address = 165072 B.
//
// Torch-free. Included by indexer_logits.cuh under __CUDACC__.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include <cstdint>

#include "common_launch.cuh"
#include "sm100_tcgen05.cuh"
#include "smxx_indexer.cuh"
#include "smxx_mbarrier.cuh"
#include "smxx_tma.cuh"

namespace dsa_cuda {
namespace sm100_indexer {

using namespace smxx_indexer;

constexpr int kTileKeys = 128;                   // MMA M: one key a tensor-memory lane
constexpr int kStages = 8;
constexpr int kRowBytes = kDim;                  // an e4m3 key or Q row: 128 bytes
constexpr int kStageBytes = kTileKeys * kRowBytes;
constexpr int kQBytes = kN * kRowBytes;
constexpr int kEpiWarps = 8;                     // two per lane quarter: column halves 0 and 1
constexpr int kEpiThreads = 32 * kEpiWarps;
constexpr int kProducerWarp = kEpiWarps;         // 8
constexpr int kMmaWarp = kEpiWarps + 1;          // 9
constexpr int kThreads = 32 * (kEpiWarps + 2);   // 320
constexpr int kTmemCols = 256;                   // two accumulators of 128 columns
constexpr int kCols = kN / 2;                    // accumulator columns an epilogue thread reads

// Shared layout from the 1024-aligned base: Q buffers, stages, barriers, the tensor memory address.
constexpr int kQOff = 0;
constexpr int kStageOff = kQOff + 2 * kQBytes;
constexpr int kBarOff = kStageOff + kStages * kStageBytes;
constexpr int kFull = 0, kEmpty = kStages, kQFull = 2 * kStages, kQEmpty = kQFull + 2, kAccFull = kQEmpty + 2,
              kAccEmpty = kAccFull + 2, kBars = kAccEmpty + 2;
constexpr int kTmemSlotOff = kBarOff + kBars * 8;
constexpr int kSmemBytes = 1024 + kTmemSlotOff + 16;
static_assert(kSmemBytes <= 232448, "over the SM100 shared memory of a CTA");

// tcgen05.mma .kind::f8f6f4: e4m3 A and B, fp32 D, M = 128, N = 128, both K-major (PTX ISA 9.7.16.4.2).
constexpr uint32_t kIdesc = (1u << 4) | (0u << 7) | (0u << 10) | (uint32_t(kN >> 3) << 17) |
                            (uint32_t(kTileKeys >> 4) << 24);

#if DSA_SM100_DEVICE

using namespace sm100;  // tcgen05 wrappers
using smxx::mbar_arrive;
using smxx::mbar_arrive_expect_tx;
using smxx::mbar_init;
using smxx::mbar_wait;
using smxx::prefetch_tensormap;
using smxx::tma_load_2d;
using smxx::tma_load_3d;

// One thread: every item's Q box and every tile's key box, in the MMA warp's order.
template <int kHeads>
__device__ __forceinline__ void produce(const KernelArgs& a, const CUtensorMap* kv_map, const CUtensorMap* q_map,
                                        uint32_t base, uint32_t bars) {
  constexpr int kRows = kN / kHeads;
  const auto bar = [bars](int k) { return bars + uint32_t(k) * 8u; };
  uint32_t it = 0, item = 0;
  for (LeanCursor cur(a); cur.valid(a); cur.next(a), ++item) {
    const Item<kRows> t = decode_item<kRows, kTileKeys>(a, cur.rb, cur.kc);
    const uint32_t qb = item & 1u;
    if (item >= 2) {  // the MMAs of item - 2 (same buffer) have completed
      mbar_wait(bar(kQEmpty + int(qb)), ((item >> 1) - 1) & 1);
    }
    mbar_arrive_expect_tx(bar(kQFull + int(qb)), kQBytes);  // rows past T count too (zero-filled)
    tma_load_3d(base + kQOff + qb * kQBytes, q_map, 0, 0, int32_t(t.row0), bar(kQFull + int(qb)));
    for (int32_t tile = t.t0; tile < t.t1; ++tile, ++it) {
      const uint32_t stage = it % kStages;
      if (it >= uint32_t(kStages)) {  // the MMAs of tile it - kStages have read the stage
        mbar_wait(bar(kEmpty + int(stage)), ((it / kStages) - 1) & 1);
      }
      mbar_arrive_expect_tx(bar(kFull + int(stage)), kStageBytes);  // a box past N counts all its bytes
      tma_load_2d(base + kStageOff + stage * kStageBytes, kv_map, 0, tile * kTileKeys, bar(kFull + int(stage)));
    }
  }
}

// Lane 0 of the MMA warp: 4 MMAs a tile into accumulator it % 2, the commits that release the stage, hand
// the accumulator to the epilogue and, after an item's last tile, free its Q buffer.
template <int kHeads>
__device__ __forceinline__ void issue_mmas(const KernelArgs& a, uint32_t base, uint32_t bars, uint32_t tmem) {
  constexpr int kRows = kN / kHeads;
  const auto bar = [bars](int k) { return bars + uint32_t(k) * 8u; };
  uint32_t it = 0, item = 0;
  for (LeanCursor cur(a); cur.valid(a); cur.next(a), ++item) {
    const Item<kRows> t = decode_item<kRows, kTileKeys>(a, cur.rb, cur.kc);
    const uint32_t qb = item & 1u;
    mbar_wait(bar(kQFull + int(qb)), (item >> 1) & 1);
    const uint32_t q_smem = base + kQOff + qb * kQBytes;
    for (int32_t tile = t.t0; tile < t.t1; ++tile, ++it) {
      const uint32_t stage = it % kStages;
      const uint32_t acc = it & 1u;
      mbar_wait(bar(kFull + int(stage)), (it / kStages) & 1);
      if (it >= 2) {  // the epilogue has read accumulator it - 2 out
        mbar_wait(bar(kAccEmpty + int(acc)), ((it >> 1) - 1) & 1);
      }
      tc_fence_after();
      const uint32_t k_smem = base + kStageOff + stage * kStageBytes;
#pragma unroll
      for (int s = 0; s < kDim / 32; ++s) {
        umma_f8(tmem + acc * 128u, umma_desc(k_smem + 32u * uint32_t(s), 16u), umma_desc(q_smem + 32u * uint32_t(s), 16u),
                kIdesc, s > 0 ? 1u : 0u);
      }
      umma_commit(bar(kEmpty + int(stage)));
      umma_commit(bar(kAccFull + int(acc)));
    }
    umma_commit(bar(kQEmpty + int(qb)));  // after every MMA of the item (none: at once)
  }
}

// The epilogue warps: for each item, weights and the -inf fill; for each tile, one key's scores of the
// thread's 64 columns (kCols / kHeads rows), stored with -inf outside each row's window.
template <int kHeads>
__device__ __forceinline__ void epilogue(const KernelArgs& a, uint32_t bars, uint32_t tmem) {
  constexpr int kRows = kN / kHeads;
  constexpr int kHalfRows = kCols / kHeads;  // rows of the thread's column half: 1 (H 64) or 2 (H 32)
  const auto bar = [bars](int k) { return bars + uint32_t(k) * 8u; };
  const int warp = int(threadIdx.x) >> 5;
  const int lane = int(threadIdx.x) & 31;
  const int quarter = warp & 3;
  const int half = warp >> 2;                  // columns [64 half, 64 half + 64)
  const int key_in_tile = 32 * quarter + lane;  // the thread's accumulator lane
  const uint32_t lane_addr = uint32_t(32 * quarter) << 16;
  const float kNegInf = __int_as_float(int(0xff800000u));
  float w[kCols];
  uint32_t it = 0;
  for (LeanCursor cur(a); cur.valid(a); cur.next(a)) {
    const Item<kRows> t = decode_item<kRows, kTileKeys>(a, cur.rb, cur.kc);
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const int col = kCols * half + j;
      const int64_t row = t.row0 + col / kHeads;
      w[j] = row < a.rows ? __ldg(a.weights + row * a.w_row_stride + (col % kHeads) * a.w_head_stride) : 0.f;
    }
    if (a.clean) {
      fill_outside_tiles<kRows, kTileKeys, kEpiThreads>(a, t);
    }
    for (int32_t tile = t.t0; tile < t.t1; ++tile, ++it) {
      const uint32_t acc = it & 1u;
      const int32_t key = tile * kTileKeys + key_in_tile;
      const float x = ldg_early(a.kv_scale + int64_t(min(key, a.keys - 1)) * a.kv_scale_stride);
      mbar_wait(bar(kAccFull + int(acc)), (it >> 1) & 1);
      tc_fence_after();
      uint32_t v0[32], v1[32];
      const uint32_t col0 = tmem + lane_addr + acc * 128u + uint32_t(kCols * half);
      tmem_ld32(col0, v0);
      tmem_ld32(col0 + 32u, v1);
      tmem_wait_ld();
      tc_fence_before();
      __syncwarp();
      if (lane == 0) {  // this warp's columns are in registers: the accumulator may be overwritten
        mbar_arrive(bar(kAccEmpty + int(acc)));
      }
      const float s = key < a.keys ? x : 0.f;
      float sum[kHalfRows][2];  // two chains a row: half the dependent FMA latency
#pragma unroll
      for (int r = 0; r < kHalfRows; ++r) {
        sum[r][0] = 0.f;
        sum[r][1] = 0.f;
      }
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const float d = __uint_as_float(j < 32 ? v0[j & 31] : v1[j & 31]);
        const float relu = s < 0.f ? fminf(d, 0.f) : fmaxf(d, 0.f);  // relu(d s) = s min(d, 0) for s < 0
        sum[j / kHeads][j & 1] = fmaf(w[j], relu, sum[j / kHeads][j & 1]);
      }
      if (key < a.keys) {
#pragma unroll
        for (int r = 0; r < kHalfRows; ++r) {
          const int rr = kHalfRows * half + r;  // the item's row
          const int64_t row = t.row0 + rr;
          if (row < a.rows) {
            const bool inside = key >= row_value(t.lo, rr) && key < row_value(t.hi, rr);
            a.out[row * a.out_row_stride + key] = inside ? (sum[r][0] + sum[r][1]) * s : kNegInf;
          }
        }
      }
    }
  }
}

#endif  // DSA_SM100_DEVICE

// kv_map: the keys as [N, 128] bytes, box [128 keys, 128 bytes]; q_map: q as [T][H][128] bytes, box
// [R rows, H heads, 128 bytes]; both 128-byte swizzle, zero fill (the launcher builds them).
template <int kHeads>
__global__ void __launch_bounds__(kThreads, 1)
    indexer_logits_kernel(const __grid_constant__ CUtensorMap kv_map, const __grid_constant__ CUtensorMap q_map,
                          const __grid_constant__ KernelArgs a) {
#if DSA_SM100_DEVICE
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t base = (raw_addr + 1023u) & ~1023u;
  const uint32_t bars = base + kBarOff;
  const uint32_t tmem_slot = base + kTmemSlotOff;
  const int warp = int(threadIdx.x) >> 5;

  if (warp == kMmaWarp) {
    asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;" ::"r"(tmem_slot),
                 "n"(kTmemCols)
                 : "memory");
    asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;" ::: "memory");
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bars + 8u * uint32_t(kFull + s), 1);
      mbar_init(bars + 8u * uint32_t(kEmpty + s), 1);
    }
    for (int b = 0; b < 2; ++b) {
      mbar_init(bars + 8u * uint32_t(kQFull + b), 1);
      mbar_init(bars + 8u * uint32_t(kQEmpty + b), 1);
      mbar_init(bars + 8u * uint32_t(kAccFull + b), 1);
      mbar_init(bars + 8u * uint32_t(kAccEmpty + b), kEpiWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  tc_fence_before();
  __syncthreads();
  tc_fence_after();
  const uint32_t tmem = *reinterpret_cast<volatile uint32_t*>(smem_raw + (base - raw_addr) + kTmemSlotOff);

  pdl_wait();
  pdl_launch_dependents();

  if (warp < kEpiWarps) {
    epilogue<kHeads>(a, bars, tmem);
  } else if (warp == kProducerWarp) {
    if ((threadIdx.x & 31) == 0) {
      prefetch_tensormap(&kv_map);
      prefetch_tensormap(&q_map);
      produce<kHeads>(a, &kv_map, &q_map, base, bars);
    }
  } else if ((threadIdx.x & 31) == 0) {
    issue_mmas<kHeads>(a, base, bars, tmem);
  }

  // Every epilogue load of tensor memory has completed (tcgen05.wait::ld) before this barrier.
  tc_fence_before();
  __syncthreads();
  tc_fence_after();
  if (warp == kMmaWarp) {
    asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;" ::"r"(tmem), "n"(kTmemCols) : "memory");
  }
#else
  __trap();  // built for a target without tcgen05: the launcher never starts it there
#endif
}

}  // namespace sm100_indexer
}  // namespace dsa_cuda
