// dsa.sparse_mla_decode on Blackwell (sm_100a, sm_103a, sm_107a): tcgen05 MMAs with fp32 accumulators in
// tensor memory, both cache layouts. COMPILED, NOT RUN: no Blackwell GPU has executed this kernel, so the
// provider declines it unless the cuda backend is forced (providers_sparse_mla_decode.py).
//
// Work split as the SM90 kernel's (smxx_sparse_mla_decode.cuh: one CTA = one query token x 64 heads x
// one split, 64-token tiles, the same gather, dequant, masking, split-KV partials and combine kernel).
//
// CTA: 13 warps (416 threads), one CTA an SM (shared memory), roles fixed:
// - warps 0-7, the loaders: slot offsets one tile ahead, the gather (global -> registers) and the dequant
//   into the K ring (smxx load_tile / store_tile, unchanged), then a full-barrier arrival per stage.
// - warps 8-11, softmax: S from tensor memory (tcgen05.ld), mask, online softmax, P into shared memory,
//   the rescale of O in tensor memory, the epilogue. Warp 8 + q reads TMEM lanes 32q..32q+31 (a warp
//   may only reach its lane quarter, warp id % 4).
// - warp 12: allocates tensor memory (512 columns), lane 0 issues every MMA and commit.
//
// Orientation. O^T[512 x 64 heads] = V^T P^T, as four M=128 MMAs (value columns 128c..128c+127, N=64
// heads): tensor memory has 512 columns of 128 lanes, and O[64 heads x 512] as an M=64 accumulator uses
// half the lanes and all 512 columns, leaving none for S. O^T takes columns 0..255 (chunk c at 64c),
// S[64 heads x 64 tokens] (M=64) two buffers at 256 and 320.
//
// The ring: four stages of 32 tokens, stage 2b + h = token half h of K tile buffer b (the SM90 layout,
// two 72 KiB tiles): four 64-token bf16 stages would take 4 x 72 KiB (v32) of the 227 KiB, Q taking 72.
// Each stage has a full barrier (the 256 loaders arrive) and an empty barrier (tcgen05.commit after the
// MMAs that read it: PV k-steps 0-1 read half 0, k-steps 2-3 half 1; QK^T of the tile was issued
// earlier, and a commit tracks every earlier MMA of the thread).
//
// Issue order of the MMA thread: QK(0), then for each tile j >= 1: QK(j), PV(j - 1); then PV(last).
// The waits that remain, each needed:
// - QK(j) half h waits full[stage]: the loaders dequantised tile j's tokens into it.
// - QK(j) waits s_free[j % 2] (j >= 2): softmax(j - 2) has read S(j - 2) out of that S buffer.
// - the loaders' store of tile j waits empty[stage] (j >= 2): PV(j - 2) has read that stage's V (and
//   QK(j - 2) its K); the validity mask of tile j is written after the same wait.
// - softmax(j) waits s_full[j % 2] (QK(j) complete) and both full barriers of tile j (its mask).
// - softmax(j) waits o_done (PV(j - 1) complete) before it writes P(j) (one P buffer: PV(j - 1) reads
//   P(j - 1)) and rescales O by alpha(j) (O must hold PV(j - 1)'s sum). This is the only order between
//   QK and PV: QK(j) itself never waits for PV(j - 1), it runs while softmax(j - 1) works.
// - PV(j) waits p_full: the 128 softmax threads wrote P(j) and rescaled O.
// - the epilogue waits o_done of the last tile.
// The tensor core runs MMAs in issue order, so QK(j) (issued before PV(j - 1)) is never held up by the
// softmax of tile j - 1: PV(j - 1) is.
//
// tcgen05 review (PTX ISA 9.x, section 9.7.16 "TensorCore 5th Generation Family Instructions"; section
// numbers below where checked, instruction names otherwise; target lists as CCCL 3.5's generated wrappers,
// cuda/__ptx/instructions/generated/tcgen05_*.h, give them: "SM_100a, SM_100f, SM_103a, SM_103f,
// SM_107a, SM_107f" for tcgen05.mma cta_group::1 kind::f16, alloc / dealloc / relinquish_alloc_permit,
// ld / st, commit, fences. So sm_107a is built, as sm_100a; nvcc 13.5 ptxas accepts both.)
// - tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [slot], 512 (tcgen05.alloc): one warp, a power
//   of two >= 32 columns; all 512 (O^T 256 + S 2 x 64 rounds up). One CTA an SM, so it never waits on
//   another CTA; tcgen05.relinquish_alloc_permit right after (this CTA allocates nothing else).
//   tcgen05.dealloc by the same warp after the epilogue's loads completed (tcgen05.wait::ld) and a CTA
//   barrier with tcgen05.fence::before_thread_sync / after_thread_sync around it.
// - tcgen05.mma.cta_group::1.kind::f16 [d], a_desc, b_desc, idesc, p (tcgen05.mma): A and B from
//   shared memory descriptors, enable-input-d p = 0 on the first k-step of a QK^T and of the split's
//   first PV, so no accumulator is zeroed. Instruction descriptor (9.7.16.4.2, table for .kind::f16):
//   bits 4-5 D type F32 = 1, 7-9 A type BF16 = 1, 10-12 B type BF16 = 1, 13/14 no negate, 15 transpose A,
//   16 transpose B, 17-22 N >> 3, 23 reserved, 24-28 M >> 4; sparsity, saturate and max shift 0.
//   QK^T: M=64, N=32 (one MMA chain a stage), A = Q and B = the K tile both K-major (no transpose).
//   PV: M=128, N=64, A = V^T: the K tile's first 512 columns read MN-major (transpose A = 1, the tile's
//   rows are tokens, the reduction axis); B = P [64 heads x 64 tokens] K-major. Shapes valid for
//   cta_group::1 kind::f16: M=64 with N % 8 == 0 in 8..256, M=128 with N % 16 == 0 in 16..256; K = 16.
// - Shared memory descriptor (the tcgen05 "shared memory descriptor" table, sm_100's, not wgmma's):
//   bits 0-13 start >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4, 46-48 the fixed constant 0b001 (absent from
//   the sm_90 format), 49-51 base offset 0 (the 1024-byte swizzle atoms sit 1024-aligned: Q, the K
//   tiles and P are; token halves start 4096 bytes in, V k-steps 2048; QK^T k-steps start 32, 64 or 96
//   bytes into an atom's row, as the SM90 kernel's do), 52 LBO mode 0 (relative), 61-63 layout type
//   2 = SWIZZLE_128B (sm_90: bits 62-63, value 1). K-major SWIZZLE_128B: SBO 1024 (8-row groups), LBO
//   unused (1). MN-major SWIZZLE_128B (9.7.16.3): LBO = stride between 64-element MN atoms = one column
//   block, 8 KiB; SBO 1024 between 8-token groups. The bytes are the SM90 kernel's Q, K tile and P.
// - Tensor memory address (tcgen05 "tensor memory addressing"): lane in bits 16-31, column in bits
//   0-15. D of QK^T in "data path layout F" (M=64, cta_group::1, 9.7.16.10.5): row r in lane
//   32 (r / 16) + r % 16, so warp 8 + q reads heads 16q..16q+15 in its lanes 0-15 (lanes 16-31 of each
//   quarter hold nothing: their threads' values are discarded). D of PV in layout D (M=128): row = lane.
// - tcgen05.ld.sync.aligned.32x32b.x32.b32 and tcgen05.st.sync.aligned.32x32b.x32.b32 (shape
//   .32x32b, 9.7.16.2.3): thread i of the warp reads lane 32q + i, 32 consecutive 32-bit columns; the
//   address's lane field is the warp's quarter base 32q. tcgen05.wait::ld / wait::st before the
//   registers are used / the columns are read by an MMA (tcgen05.wait).
// - tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [bar] (tcgen05.commit): one
//   arrival when every earlier tcgen05.mma of the thread completed; the barriers it signals count 1.
//   A shared::cta address is a valid shared::cluster address of the own CTA.
// - tcgen05.fence::after_thread_sync after each mbarrier wait that precedes a tcgen05 op (MMA issue,
//   ld, st), tcgen05.fence::before_thread_sync before each arrival that follows one (tcgen05.fence);
//   fence.proxy.async.shared::cta after generic-proxy writes of K, Q, P that an MMA reads.
//
// Shared memory (v32): 1 KiB alignment slack + Q 72 KiB + two K tiles 2 x 72 KiB + P 8 KiB + tile
// offsets 2 x 64 x 8 B + masks 16 B + row factors 256 B + 14 mbarriers + the TMEM address = 231824 B
// of 232448 (v4: 208272 B).
//
// Torch-free. Included by sparse_mla_decode.cuh under __CUDACC__.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common_launch.cuh"
#include "smxx_mbarrier.cuh"
#include "sm100_tcgen05.cuh"
#include "smxx_sparse_mla_decode.cuh"

namespace dsa_cuda {
namespace sm100_mla_decode {

using smxx_mla_decode::KernelArgs;
using smxx_mla_decode::kBlockBytes;
using smxx_mla_decode::kHeads;
using smxx_mla_decode::kLoaders;
using smxx_mla_decode::kTile;

constexpr int kSoftmax = 128;                           // warps 8-11
constexpr int kThreads = kLoaders + kSoftmax + 32;      // + the MMA warp
constexpr int kMmaWarp = (kLoaders + kSoftmax) / 32;    // 12
constexpr int kMaxRegs = 152;                          // 65536 / 416 rounded down to 8
constexpr int kTmemCols = 512;
constexpr uint32_t kSCol = 256;                         // S buffers: columns 256 and 320; O^T: 0..255
constexpr int kBarLoaders = 2;                          // named barriers (0 is __syncthreads)
constexpr int kBarSoftmax = 3;

// The shared layout plus the masks [2 buffers][2 words], the row factors [64], the mbarriers and the
// tensor memory address.
template <bool kV4>
struct Cfg : smxx_mla_decode::Layout<kV4> {
  using L = smxx_mla_decode::Layout<kV4>;
  static constexpr int kMaskOff = L::kOffsEnd;
  static constexpr int kRowOff = kMaskOff + 16;
  static constexpr int kBarOff = kRowOff + kHeads * 4;  // full[4], empty[4], s_full[2], s_free[2], p_full, o_done
  static constexpr int kBars = 14;
  static constexpr int kTmemSlotOff = kBarOff + kBars * 8;
  static constexpr int kSmemBytes = 1024 + kTmemSlotOff + 16;
  // Pieces of a loader thread whose tokens are all in the tile's first half (< 32), and whether that
  // split is exact (v32: 5 of 10; v4: 4 of 9, the fifth straddles the halves).
  static constexpr int kLoUnits = 32 * L::kPieces / kLoaders;
  static constexpr bool kLoExact = 32 * L::kPieces % kLoaders == 0;
  static_assert(kSmemBytes <= 232448, "over the SM100 shared memory of a CTA");
};

// Barrier indices (8 bytes each from kBarOff).
constexpr int kFull = 0, kEmpty = 4, kSFull = 8, kSFree = 10, kPFull = 12, kODone = 13;

// Instruction descriptor of tcgen05.mma .kind::f16: bf16 A and B, fp32 D (PTX ISA 9.7.16.4.2).
constexpr uint32_t idesc_bf16(int m, int n, bool transpose_a, bool transpose_b) {
  return (1u << 4) | (1u << 7) | (1u << 10) | (uint32_t(transpose_a) << 15) | (uint32_t(transpose_b) << 16) |
         (uint32_t(n >> 3) << 17) | (uint32_t(m >> 4) << 24);
}
constexpr uint32_t kIdescQk = idesc_bf16(64, 32, false, false);
constexpr uint32_t kIdescPv = idesc_bf16(128, 64, true, false);

#if DSA_SM100_DEVICE

using namespace smxx_mla_decode;
using namespace sm100;  // tcgen05 wrappers

using smxx::mbar_arrive;  // smxx_mbarrier.cuh
using smxx::mbar_init;
using smxx::mbar_wait;

__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

#endif  // DSA_SM100_DEVICE

// 13 warps: __launch_bounds__(416, 1) makes ptxas plan for 512 threads, 128 registers a thread, and the
// non-split kernels spilled 4 bytes; 152 x 416 fits the 64 K registers of an SM (__maxnreg__ excludes
// __launch_bounds__).
template <bool kV4, bool kSplit>
__global__ void __maxnreg__(kMaxRegs) sparse_mla_decode_kernel(const __grid_constant__ KernelArgs a) {
#if DSA_SM100_DEVICE
  using C = Cfg<kV4>;
  const AlignedDynSmem smem;
  const uint32_t base = smem.addr;
  uint8_t* const base_ptr = smem.ptr;
  const uint32_t q_smem = base + C::kQOff;
  const uint32_t k_smem = base + C::kKOff;
  const uint32_t p_smem = base + C::kPOff;
  int64_t* const offs = reinterpret_cast<int64_t*>(base_ptr + C::kOffsOff);  // [2][kOffArrays * 64]
  volatile uint32_t* const mask = reinterpret_cast<uint32_t*>(base_ptr + C::kMaskOff);  // [2][2]
  float* const rowf = reinterpret_cast<float*>(base_ptr + C::kRowOff);                  // [64]
  const uint32_t bars = base + C::kBarOff;
  const uint32_t tmem_slot = base + C::kTmemSlotOff;
  constexpr int kOffsStride = C::kOffArrays * kTile;
  const auto bar = [bars](int k) { return bars + uint32_t(k) * 8u; };

  const int tid = int(threadIdx.x);
  const int warp = tid >> 5;
  const int lane = tid & 31;

  const auto [hb, split, b, i, prog] = cta_work(a);

  pdl_wait();
  pdl_launch_dependents();

  const auto [n_end, t0, t1, idx_row] = cta_span(a, b, i, split);
  const int32_t n = max(t1 - t0, 0);  // this split's tiles

  if (tid < kLoaders) {
    stage_q<kV4, kLoaders>(a, q_smem, b, i, hb, tid);
    if (tid < kTile) {  // byte offsets of the split's first tile
      store_offsets<kV4>(a, load_slot(a, idx_row, t0, t1, n_end, tid), tid, offs);
    }
  }
  if (warp == kMmaWarp) {
    asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;" ::"r"(tmem_slot),
                 "n"(kTmemCols)
                 : "memory");
    asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;" ::: "memory");
  }
  if (tid == 0) {
    for (int s = 0; s < 4; ++s) {
      mbar_init(bar(kFull + s), kLoaders);
      mbar_init(bar(kEmpty + s), 1);
    }
    for (int s = 0; s < 2; ++s) {
      mbar_init(bar(kSFull + s), 1);
      mbar_init(bar(kSFree + s), kSoftmax);
    }
    mbar_init(bar(kPFull), kSoftmax);
    mbar_init(bar(kODone), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  fence_async_smem();  // Q (cp.async) -> the MMAs' async-proxy reads
  tc_fence_before();
  __syncthreads();
  tc_fence_after();
  const uint32_t tmem = *reinterpret_cast<volatile uint32_t*>(base_ptr + C::kTmemSlotOff);

  if (tid < kLoaders) {
    // ---- loaders: tile j of the split into K buffer j % 2, stages 2 (j % 2) and 2 (j % 2) + 1.
    for (int32_t j = 0; j < n; ++j) {
      const int st = j & 1;
      const uint32_t kt = k_smem + uint32_t(st) * C::kTileBytes;
      const int64_t* of = offs + st * kOffsStride;
      Raw<kV4> r;
      load_tile<kV4>(a, of, tid, r);
      int32_t slot1 = -1;
      uint32_t valid = 0;
      if (tid < kTile) {
        slot1 = load_slot(a, idx_row, t0 + j + 1, t1, n_end, tid);
        valid = __ballot_sync(0xffffffffu, of[tid] >= 0);
      }
      const uint32_t par = uint32_t((j >> 1) + 1) & 1u;  // phase of PV(j - 2)'s release
      if (j >= 2) {
        mbar_wait(bar(kEmpty + 2 * st), par);
      }
      if (tid < kTile && lane == 0) {
        mask[2 * st + warp] = valid;
      }
      store_tile<kV4, 0, C::kLoUnits>(kt, tid, r);
      if constexpr (C::kLoExact) {
        fence_async_smem();
        mbar_arrive(bar(kFull + 2 * st));
      }
      if (j >= 2) {
        mbar_wait(bar(kEmpty + 2 * st + 1), par);
      }
      store_tile<kV4, C::kLoUnits, C::kUnits>(kt, tid, r);
      fence_async_smem();
      if constexpr (!C::kLoExact) {
        mbar_arrive(bar(kFull + 2 * st));
      }
      mbar_arrive(bar(kFull + 2 * st + 1));
      if (tid < kTile) {  // tile j + 1's offsets; tile j - 1's were last read before the barrier below
        store_offsets<kV4>(a, slot1, tid, offs + (st ^ 1) * kOffsStride);
      }
      named_barrier(kBarLoaders, kLoaders);
    }
  } else if (warp == kMmaWarp) {
    // ---- MMA issue: QK(0), then QK(j), PV(j - 1) for j >= 1, then PV(last).
    if (lane == 0 && n > 0) {
      const auto issue_qk = [&](int32_t j) {
        const int st = j & 1;
        const uint32_t kt = k_smem + uint32_t(st) * C::kTileBytes;
        const uint32_t d = tmem + kSCol + 64u * uint32_t(st);
        if (j >= 2) {
          mbar_wait(bar(kSFree + st), uint32_t((j >> 1) + 1) & 1u);
        }
#pragma unroll 1
        for (int h = 0; h < 2; ++h) {
          mbar_wait(bar(kFull + 2 * st + h), uint32_t(j >> 1) & 1u);
          tc_fence_after();
#pragma unroll
          for (int ks = 0; ks < C::kBlocks * 4; ++ks) {
            const uint32_t off = uint32_t(ks >> 2) * kBlockBytes + uint32_t(ks & 3) * 32u;
            umma(d + 32u * uint32_t(h), umma_desc(q_smem + off, 16u), umma_desc(kt + 4096u * uint32_t(h) + off, 16u),
                 kIdescQk, ks > 0 ? 1u : 0u);
          }
        }
        umma_commit(bar(kSFull + st));
      };
      const auto issue_pv = [&](int32_t j) {
        const int st = j & 1;
        const uint32_t kt = k_smem + uint32_t(st) * C::kTileBytes;
        mbar_wait(bar(kPFull), uint32_t(j) & 1u);
        tc_fence_after();
#pragma unroll
        for (int kk = 0; kk < kTile / 16; ++kk) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const uint32_t v = kt + uint32_t(2 * c) * kBlockBytes + uint32_t(kk) * 2048u;  // V^T chunk c
            umma(tmem + 64u * uint32_t(c), umma_desc(v, kBlockBytes), umma_desc(p_smem + uint32_t(kk) * 32u, 16u),
                 kIdescPv, (j > 0 || kk > 0) ? 1u : 0u);
          }
          if (kk == 1) {
            umma_commit(bar(kEmpty + 2 * st));  // tokens 0-31 of this buffer read
          }
        }
        umma_commit(bar(kEmpty + 2 * st + 1));
        umma_commit(bar(kODone));
      };
      issue_qk(0);
#pragma unroll 1
      for (int32_t j = 1; j < n; ++j) {
        issue_qk(j);
        issue_pv(j - 1);
      }
      issue_pv(n - 1);
    }
    __syncwarp();
  } else {
    // ---- softmax: thread lane < 16 of warp 8 + q owns head row h = 16 q + lane.
    const int q = warp & 3;
    const int h = 16 * q + lane;
    const bool owner = lane < 16;
    const uint32_t lane_base = tmem + (uint32_t(32 * q) << 16);
    float m = smxx_mla_decode::kNeg;  // running row max (log2 domain)
    float l = 0.f;                    // running row sum
#pragma unroll 1
    for (int32_t j = 0; j < n; ++j) {
      const int st = j & 1;
      const uint32_t par = uint32_t(j >> 1) & 1u;
      uint32_t s[64];
      mbar_wait(bar(kSFull + st), par);
      tc_fence_after();
      {
        uint32_t (&s0)[32] = *reinterpret_cast<uint32_t(*)[32]>(&s[0]);
        uint32_t (&s1)[32] = *reinterpret_cast<uint32_t(*)[32]>(&s[32]);
        tmem_ld32(lane_base + kSCol + 64u * uint32_t(st), s0);
        tmem_ld32(lane_base + kSCol + 64u * uint32_t(st) + 32u, s1);
        tmem_wait_ld();
      }
      tc_fence_before();
      mbar_arrive(bar(kSFree + st));
      mbar_wait(bar(kFull + 2 * st), par);  // the tile's mask (written before these arrivals)
      mbar_wait(bar(kFull + 2 * st + 1), par);
      const uint32_t v0 = mask[2 * st];
      const uint32_t v1 = mask[2 * st + 1];

      float mx = smxx_mla_decode::kNeg;
#pragma unroll
      for (int c = 0; c < 64; ++c) {
        const bool v = (((c < 32 ? v0 : v1) >> (c & 31)) & 1u) != 0u;
        const float x = v ? __uint_as_float(s[c]) * a.qk_scale : smxx_mla_decode::kNeg;
        s[c] = __float_as_uint(x);
        mx = fmaxf(mx, x);
      }
      const float mn = fmaxf(m, mx);
      const float alpha = exp2f(m - mn);
      m = mn;
      float sum = 0.f;
      uint32_t pw[32];
#pragma unroll
      for (int c = 0; c < 64; c += 2) {
        const bool va = (((c < 32 ? v0 : v1) >> (c & 31)) & 1u) != 0u;
        const bool vb = (((c < 32 ? v0 : v1) >> ((c + 1) & 31)) & 1u) != 0u;
        const float pa = va ? exp2f(__uint_as_float(s[c]) - mn) : 0.f;
        const float pb = vb ? exp2f(__uint_as_float(s[c + 1]) - mn) : 0.f;
        sum += pa + pb;
        pw[c / 2] = pack_bf16(pa, pb);
      }
      l = l * alpha + sum;
      if (j > 0) {  // PV(j - 1) complete: P free, O holds its sum
        mbar_wait(bar(kODone), uint32_t(j - 1) & 1u);
        tc_fence_after();
      }
      if (owner) {
        // P[h, tokens]: K-major, 128-byte rows, 16-byte chunk k at (k ^ (h % 8)).
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          sts128(p_smem + uint32_t(h) * 128u + ((uint32_t(k) ^ uint32_t(h & 7)) << 4), pw[4 * k], pw[4 * k + 1],
                 pw[4 * k + 2], pw[4 * k + 3]);
        }
        rowf[h] = alpha;
      }
      named_barrier(kBarSoftmax, kSoftmax);  // every row's alpha
      if (j > 0) {  // O^T[value column, head] *= alpha[head]
#pragma unroll 1
        for (int cc = 0; cc < 8; ++cc) {
          const uint32_t col = 32u * uint32_t(cc);  // chunk cc / 2, heads 32 (cc % 2) ..
          uint32_t o[32];
          tmem_ld32(lane_base + col, o);
          tmem_wait_ld();
          const float* al = rowf + 32 * (cc & 1);
#pragma unroll
          for (int k = 0; k < 32; ++k) {
            o[k] = __float_as_uint(__uint_as_float(o[k]) * al[k]);
          }
          tmem_st32(lane_base + col, o);
        }
        tmem_wait_st();
      }
      fence_async_smem();  // P -> the PV MMA
      tc_fence_before();
      mbar_arrive(bar(kPFull));
    }

    // Epilogue: O^T from tensor memory; thread (q, lane) holds value column 128 c + 32 q + lane of
    // every head.
    if (n > 0) {
      mbar_wait(bar(kODone), uint32_t(n - 1) & 1u);
      tc_fence_after();
    }
    const int64_t pidx = int64_t(prog) * a.splits + split;
    if (owner) {
      if constexpr (kSplit) {
        write_ml(a, pidx, h, m, l);
      } else {
        float inv, lse;
        finish_row(m, l, a.sink, hb * kHeads + h, inv, lse);
        rowf[h] = inv;
        a.lse[(int64_t(b) * a.heads + hb * kHeads + h) * a.s_q + i] = lse;
      }
    }
    named_barrier(kBarSoftmax, kSoftmax);
    if (!kSplit || n > 0) {  // the combine skips empty splits, so they write no partial
      __nv_bfloat16* ob = a.out + int64_t(b) * a.o_sb + int64_t(i) * a.o_ss + int64_t(hb) * kHeads * a.o_sh;
#pragma unroll 1
      for (int cc = 0; cc < 8; ++cc) {
        const int dcol = 128 * (cc >> 1) + 32 * q + lane;  // value column
        const int h0 = 32 * (cc & 1);
        uint32_t o[32];
        if (n > 0) {
          tmem_ld32(lane_base + 32u * uint32_t(cc), o);
          tmem_wait_ld();
        } else {
#pragma unroll
          for (int k = 0; k < 32; ++k) {
            o[k] = 0u;
          }
        }
#pragma unroll
        for (int k = 0; k < 32; ++k) {
          if constexpr (kSplit) {
            *part_at(a, pidx, h0 + k, dcol) = __uint_as_float(o[k]);
          } else {
            ob[int64_t(h0 + k) * a.o_sh + dcol] = __float2bfloat16_rn(__uint_as_float(o[k]) * rowf[h0 + k]);
          }
        }
      }
    }
  }

  tc_fence_before();
  __syncthreads();  // every MMA complete (o_done) and every tensor memory load waited
  if (warp == kMmaWarp) {
    tc_fence_after();
    asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;" ::"r"(tmem), "n"(kTmemCols) : "memory");
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built for a target without tcgen05: the launcher never starts it there
#endif  // DSA_SM100_DEVICE
}

}  // namespace sm100_mla_decode
}  // namespace dsa_cuda
