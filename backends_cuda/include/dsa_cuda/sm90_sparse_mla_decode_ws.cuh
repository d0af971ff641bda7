// dsa.sparse_mla_decode on Hopper (sm_90a), warp-specialised (launcher variant 3, which the provider picks on
// SM90: providers_sparse_mla_decode.variant_for). Same work split, arguments, partials and combine as
// sm90_sparse_mla_decode.cuh (variant 0); what differs is who does what in a CTA.
//
// Why: variant 0 runs each 64-token tile as one serial chain on all 8 warps (gather, QK^T, row-max exchange,
// softmax, P, PV, dequant of the next tile under PV), one CTA an SM. ncu (H200, batch 128, 128 heads, s_q 2):
// issue slots 43% busy, 15.9k warp instructions and ~9.6k cycles a tile against the ~2.2k its MMAs need.
//
// CTA: three warpgroups (384 threads), FlashMLA's split of roles:
// - Warpgroup 0, the producer (setmaxnreg kProducerRegs; `producer` below): 4 threads a token, two tokens a
//   thread (the half-tiles); each thread's token slot, read a tile ahead, becomes a row pointer; the gather
//   into registers and the exact dequant into one of two K stages, each piece's register refilled with the next
//   tile's piece as soon as it is stored; the valid-token mask into a 3-slot ring; `full[s]` (an mbarrier, 128
//   arrivals) when a stage is written; the stage-free wait is a named barrier (kBarEmpty + s) that the math
//   warpgroups arrive on.
// - Warpgroup 1, QK (setmaxnreg kQkRegs): S = Q K^T for all 64 tokens (wgmma m64n64k16: Q read from shared
//   memory once per 64 tokens), the online softmax (a row's values sit in one quad: no exchange between
//   warpgroups), P into shared memory, the rescale factors into `row_f`, and O[:, 0:256] += P V.
//   PV(n) and QK^T(n + 1) are issued back to back, PV(n) first: stage n is released as soon as PV(n) is done,
//   without waiting for tile n + 1's stage (`qk_role`).
// - Warpgroup 2, PV (the launch allocation): O[:, 256:512] *= alpha(n); O += P(n) V(n).
//   QK and PV hand P over with two named barriers, both warpgroups syncing on each (`handover`): kBarPReady
//   (P(n) and alpha(n) written) and kBarPFree (PV(n) done reading them, so QK may write P(n + 1)). Syncing
//   costs nothing over arriving (each side waits for the next handover anyway) and orders the reads before
//   the barrier for compute-sanitizer racecheck (with bar.arrive it reported the alpha reads).
//
// Measured (H200, b128 h128 s_q2): the first form (a producer in half-tiles with offsets published through
// shared memory, removed) 640.0 -> 580.9 us v32, 612.0 -> 500.9 v4 against variant 0 (FlashMLA 415 / 391); the
// lean producer and softmax below 2-4.5% faster again. Tried and refuted: whole-tile register prefetch with 2
// threads a token (775 us: the next tile's loads stalled the very next store); an L2 bulk prefetch of the next
// tile's rows (577.8 -> 648.5 us); on this form (H100, b128 h128 s_q2): prefetch.global.L2 of the rows a tile
// ahead 461.9 -> 469.4 us, L1::no_allocate gathers 518.1, four tiles a basic block 485.8, evict_first /
// evict_normal / no L1 policy 465.0 -> 468.6-471.8, half a tile of loads in flight 469.2. ncu: QK waits on `full`
// and the producer's first conversions on their loads, so the producer bounds it (docs/design_attention.md:
// with every load an L1 hit the kernel is ~20% faster, with no producer work ~40%).
//
// Shared memory (v32; v4 has 8 column blocks, not 9): 1 KiB alignment slack + Q 72 KiB + 2 K stages x 72 KiB + P
// 8 KiB + masks 3 x 8 B + row_f 64 x 4 B + 2 mbarriers = 230696 B of the 232448 B a CTA may have (v4: 206120 B).
//
// Registers: launched with 168 a thread (384 x 168 = 64512 = 128 x (128 + 208 + 168)); setmaxnreg cannot go
// past the launch allocation. Each role runs to its own exit after its setmaxnreg (a path shared by two
// budgets makes ptxas drop them, C7507). nvcc 13.0: 0 spills.
//
// Torch-free. Included by sparse_mla_decode.cuh under __CUDACC__.
#pragma once

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common_launch.cuh"
#include "sm90_indexer_core.cuh"  // wgmma helpers, mbarriers, setmaxnreg
#include "sm90_sparse_mla_decode.cuh"
#include "smxx_sparse_mla_decode.cuh"

namespace dsa_cuda {
namespace sm90_mla_decode_ws {

using smxx_mla_decode::kBlockBytes;
using smxx_mla_decode::kHeads;
using smxx_mla_decode::KernelArgs;
using smxx_mla_decode::kNeg;
using smxx_mla_decode::kTile;

constexpr int kThreads = 384;
constexpr int kProducer = 128;
constexpr int kProducerRegs = 128;  // 136 / 200 / 168 also compiles clean; PV below 168 does not (C7507)
constexpr int kQkRegs = 208;
constexpr int kPvRegs = 168;
constexpr int kLaunchRegs = 168;  // ptxas's count under __launch_bounds__(384, 1)
static_assert(128 * (kProducerRegs + kQkRegs + kPvRegs) <= kThreads * kLaunchRegs,
              "setmaxnreg beyond the CTA's register allocation");
constexpr int kOffSlots = 3;  // tile n + 1's offsets are written once the math is done with tile n - 2
// Named barriers (0 is __syncthreads).
constexpr int kBarPReady = 1;
constexpr int kBarPFree = 2;
constexpr int kBarMath = 4;
// The producer's stage-free barriers (one a stage): 256 math threads arrive, 128 producer threads sync.
constexpr int kBarEmpty = 5;  // + stage
constexpr int kEmptyThreads = 384;
constexpr float kLazyGrowth = 8.f;  // the softmax's running-max slack (log2 units)

template <bool kV4>
struct Cfg {
  using L = smxx_mla_decode::Layout<kV4>;
  static constexpr int kQOff = 0;
  static constexpr int kKOff = L::kTileBytes;
  static constexpr int kPOff = kKOff + 2 * L::kTileBytes;
  static constexpr int kMaskOff = kPOff + kBlockBytes;           // P: [64 x 64] bf16
  static constexpr int kRowOff = kMaskOff + kOffSlots * 8;
  static constexpr int kBarOff = kRowOff + kHeads * 4;           // full[2]
  static constexpr int kSmemBytes = 1024 + kBarOff + 2 * 8;
  static_assert(kSmemBytes <= 232448, "over the SM90 shared memory of a CTA");
};

// The producer's row for an invalid token: its loads read zero bytes (e4m3 0 and rope 0; scale 0, or 2^-127
// from a v4 scale byte 0, times 0), so the token's K
// and V rows are 0. (Declared for both compilation passes: the host stub registers it.)
static __device__ __align__(256) const uint8_t kZeroRow[1024] = {};

#if DSA_SM90_INDEXER_DEVICE

using namespace smxx_mla_decode;
using sm90_indexer::fence_acc;
using sm90_indexer::mbar_arrive;
using sm90_indexer::mbar_init;
using sm90_indexer::mbar_wait;
using sm90_indexer::setmaxnreg_dec;
using sm90_indexer::setmaxnreg_inc;
using sm90_indexer::sw128_desc;
using sm90_indexer::wgmma_commit;
using sm90_indexer::wgmma_fence;
using sm90_indexer::wgmma_wait_all;
using sm90_mla_decode::scale_rows;
using sm90_mla_decode::store_out;
using sm90_mla_decode::store_partial;
using sm90_mla_decode::sw128_mn_desc;
using sm90_mla_decode::wgmma_pv;

// A named barrier of n threads, the warp converged first (bar.sync is .aligned).
__device__ __forceinline__ void bar_sync(int id, int n) {
  __syncwarp();
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}

// The QK / PV handover barriers (kBarPReady, kBarPFree; 256 threads), one instruction for both warpgroups.
// compute-sanitizer synccheck reports "divergent threads" at it, as it does at the same handover alone
// (tools/synccheck_handover.cu, every mode); racecheck and memcheck are clean (docs/design_attention.md).
__device__ __noinline__ void handover(int id) { bar_sync(id, 256); }

__device__ __forceinline__ void wgmma_wait_1() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }

// The thread index as an opaque value: from a loop-invariant one ptxas hoists every piece's token, column
// and swizzled offsets out of the producer's loop and runs out of registers.
__device__ __forceinline__ int tid_opaque() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

#define DSA_S8(b)                                                                                     \
  "+f"(d[b + 0]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), \
      "+f"(d[b + 6]), "+f"(d[b + 7])

// S[64 x 64] (+)= A * B, both from shared memory (K-major descriptors); accumulate iff `acc`.
__device__ __forceinline__ void wgmma_qk64(float (&d)[32], uint64_t da, uint64_t db, uint32_t acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : DSA_S8(0), DSA_S8(8), DSA_S8(16), DSA_S8(24)
      : "l"(da), "l"(db), "r"(acc));
}

#undef DSA_S8

// Issue S = Q K^T over the stage at `kt` (committed, not waited).
template <int kBlocks>
__device__ __forceinline__ void issue_qk(float (&s)[32], uint64_t q_desc, uint32_t kt) {
  const uint64_t k_desc = sw128_desc(kt);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kBlocks * 4; ++ks) {
    const uint32_t off = uint32_t(ks >> 2) * kBlockBytes + uint32_t(ks & 3) * 32u;
    wgmma_qk64(s, q_desc + (off >> 4), k_desc + (off >> 4), ks > 0 ? 1u : 0u);
  }
  wgmma_commit();
}

// Issue O[:, 256 half .. 256 half + 255] += P V over the stage at `kt` (committed, not waited).
__device__ __forceinline__ void issue_pv(float (&o)[128], uint32_t p_smem, uint32_t kt, int half) {
  const uint64_t v_desc = sw128_mn_desc(kt + uint32_t(half) * 4u * kBlockBytes, kBlockBytes);
  const uint64_t p_desc = sw128_desc(p_smem);
  fence_acc(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    wgmma_pv(o, p_desc + ((uint32_t(kk) * 32u) >> 4), v_desc + ((uint32_t(kk) * 2048u) >> 4));
  }
  wgmma_commit();
}

// A producer thread's share of a token, 4 threads a token (q = 0..3): its 16-byte pieces 4 k + q (e4m3 first,
// then rope: the 4 threads of a token take the same path at every k, and the e4m3 pieces' scale group and
// column block are compile-time), with the token's scales in one load (v32: 4 fp32; v4: 7 ue8m0 bytes).
// v4: an odd token takes its two rope pieces in the other order (rope_flip): a 16-byte store serves 8 threads a
// wavefront, tokens 2 t and 2 t + 1 of a warp, and in the same order their pieces land in the same 4 of a row's 8
// swizzled chunks (ncu, H100, v32: 2 wavefronts a rope store where 1 is ideal, 10% of the producer's store
// wavefronts). H100, same run: v4 b128 h128 s_q2 449.5 -> 429.8 us (FlashMLA 395.1); on v32 the same change
// was 3.5-4.6% slower at batch 64-128 (462.3 -> 483.6 us there), so v32 keeps the plain order.
template <bool kV4>
struct TokenPart {
  static constexpr int kN = Layout<kV4>::kPieces / 4;
  static constexpr int kFp8 = Layout<kV4>::kFp8Pieces / 4;
  static_assert(Layout<kV4>::kFp8Pieces % 4 == 0, "a token's e4m3 and rope pieces split evenly over 4 threads");
  uint4 v[kN];
  uint4 sc;
};

__device__ __forceinline__ uint32_t word(const uint4& v, int k) { return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w; }

// Piece k of a token's row (tok: row `row` of the stage, swizzle sw = tok % 8) dequantised and stored: e4m3 piece
// 4 k + q, scale group k (v4, 64 values) or k / 2 (v32, 128), column block k; or bf16 rope piece
// 4 (k - kFp8) + q (v4: 4 ((k - kFp8) ^ (tok % 2)) + q).
template <bool kV4>
__device__ __forceinline__ void store_piece(uint32_t row, uint32_t sw, int k, int q, const TokenPart<kV4>& r) {
  using C = Layout<kV4>;
  using H = TokenPart<kV4>;
  if (k < H::kFp8) {
    const int g = kV4 ? k : k >> 1;
    uint32_t w[8];
    dequant16<kV4>(r.v[k], kV4 ? (word(r.sc, g >> 2) >> (8 * (g & 3))) & 0xFFu : word(r.sc, g), w);
    const uint32_t blk = row + uint32_t(k) * kBlockBytes;  // 16 columns a piece, 64 a block
    const uint32_t c0 = uint32_t(q) * 2u;
    sts128(blk + ((c0 ^ sw) << 4), w[0], w[1], w[2], w[3]);
    sts128(blk + (((c0 + 1u) ^ sw) << 4), w[4], w[5], w[6], w[7]);
  } else {
    const uint32_t c0 = ((uint32_t(k - H::kFp8) ^ (kV4 ? sw & 1u : 0u)) << 2) + uint32_t(q);
    sts128(row + C::kRopeBlock * kBlockBytes + ((c0 ^ sw) << 4), r.v[k].x, r.v[k].y, r.v[k].z, r.v[k].w);
  }
}

// ---- The producer and softmax ----
// Static SASS of the first form (variant 1, removed) against FlashMLA's kernel (v32, 64 heads, a 64-token tile,
// a warp): producer 1148 / 1074 instructions (warps 0-1 / 2-3) against FlashMLA's 1080, QK warpgroup 1083
// against 836; ptxas put the producer's 22 loads of a tile on one scoreboard waited for by the tile's first
// conversion, 31 cycles after the second half-tile's loads were issued (one whole memory latency a tile,
// whatever the two register sets); each tile a producer-wide named barrier behind offsets that warps 0-1
// published through shared memory (a signed division by the page size there); 36 register zeroings and a
// branch region a half-tile for invalid tokens.
// What the lean form changed:
// - each thread turns its own token's slot (read a tile ahead) into a row pointer, the page by fast_div
//   (smxx_fast_div.cuh); invalid tokens read kZeroRow (zero bytes): no branch, no zeroing, no barrier;
// - each piece's register is reloaded with the next tile's piece as soon as its dequant is stored;
// - tiles go in pairs, one basic block a pair: the stage-free wait is a named barrier (bar.sync kBarEmpty + stage,
//   no polling loop; the math warpgroups bar.arrive), so ptxas sees the second tile use the loads the first
//   issues and keeps them early and on their own scoreboards (a load used only in the next iteration it sinks to
//   the end of the loop; the SASS still has the second half-tile's refills after the second tile's bar.sync);
//   an odd count gets an all-invalid last tile, which the math warpgroups count too (math_work): a whole tile
//   of zeros, so an odd-count CTA does one tile more;
// - the mask goes to the QK warpgroup as a byte a warp (8 tokens, redux.or);
// - the softmax tests each mask bit once, takes exp2 as one MUFU.EX2 and rescales lazily (qk_role's softmax):
//   O's rescale (128 FMULs a thread in each math warpgroup) only when a row's max grows by more than kLazyGrowth.
// Static result (nvcc 13.0, v32, per tile a warp): producer 997 instructions, two waits a pair of tiles with
// 149 and 59 cycles of issue between their newest load and the wait (the second: a scoreboard shared with an
// older batch; the other eight waits 250-460 cycles), QK warpgroup 735 with the rescale, ~600 without.
// H200 (tools/smoke_sparse_mla_decode.py --time, same run): 2-4.5% faster than the first form at every batch
// 32-128 cell (b128 h64 s_q1 v32 135.2 -> 130.9 us, b128 h128 s_q2 485.3 -> 463.8), level at batch 1-4; predicted
// 5-12%. Removing the first form left this kernel's SASS unchanged apart from its two unused mbarriers and the
// shared-memory offsets past its offset ring (nvcc 13.0, cuobjdump).

// Where a producer thread's token reads (q: its quarter of each 64-byte run): row + 16 q, and the scales.
struct TokenRows {
  const uint8_t* row;  // + 16 q
  uint32_t sc;         // v4: its 8 bytes of ue8m0 scales at row + sc (a 32-bit offset: one register fewer)
  uint32_t valid;
};

template <bool kV4>
__device__ __forceinline__ TokenRows token_rows(const KernelArgs& a, int32_t slot, int q) {
  using C = Layout<kV4>;
  TokenRows t;
  t.valid = slot >= 0 && int64_t(slot) < a.nslots ? 1u : 0u;
  const uint32_t sl = t.valid != 0u ? uint32_t(slot) : 0u;  // no address is formed from an invalid slot
  const uint32_t page = fast_div(sl, a.page_mul, a.page_shift);
  const uint32_t off = sl - page * uint32_t(a.page);
  // Pointers chosen by a mask, not a select, so that ptxas keeps the producer's tile one basic block.
  const uint64_t keep = t.valid != 0u ? ~uint64_t(0) : uint64_t(0);
  const uint64_t zero = reinterpret_cast<uint64_t>(a.zero_row);  // kZeroRow
  const uint64_t pb = reinterpret_cast<uint64_t>(a.cache) + uint64_t(page) * uint64_t(a.page_stride);
  const uint64_t row = zero + ((pb + off * uint32_t(C::kTokenBytes) - zero) & keep);
  t.row = reinterpret_cast<const uint8_t*>(row + 16u * uint32_t(q));
  // v4: scales at page + P x 576 + 8 off, P x 576 - 568 off - 16 q (> 0) past the row; a zero row's are its own.
  t.sc = kV4 ? uint32_t(a.page) * 576u - off * 568u - 16u * uint32_t(q) : 0u;
  t.sc &= uint32_t(keep);
  return t;
}

// bar.sync for a warp known to be converged (the producer's straight-line tile: a __syncwarp there costs the
// producer 8-32 bytes of spills).
__device__ __forceinline__ void bar_sync_converged(int id, int n) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}

__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}

// A token's rope order as a flip of the piece's byte offset: 64 for an odd token of v4 (TokenPart), else 0.
template <bool kV4>
__device__ __forceinline__ uint32_t rope_order(int tok) { return kV4 ? uint32_t(tok & 1) << 6 : 0u; }

// Piece k of a token's row (rope_flip: rope_order of the token).
template <bool kV4>
__device__ __forceinline__ uint4 load_piece(const TokenRows& t, int k, uint32_t rope_flip) {
  using C = Layout<kV4>;
  using H = TokenPart<kV4>;
  return k < H::kFp8 ? ldg128<Ldg::kKeep>(t.row + 64 * k)
                      : ldg128<Ldg::kKeepNear>(t.row + C::kRopeByte + ((64u * uint32_t(k - H::kFp8)) ^ rope_flip));
}

template <bool kV4>
__device__ __forceinline__ uint4 load_scales(const TokenRows& t, int q) {
  if constexpr (kV4) {
    const uint2 v = ldg64(t.row + t.sc);
    return make_uint4(v.x, v.y, 0u, 0u);
  } else {
    return ldg128<Ldg::kKeepNear>(t.row + (512 - 16 * q));
  }
}

// A token's pieces dequantised and stored into its stage row, each piece below kReload reloaded from `next` once
// its dequant is stored, and the scales (which every e4m3 piece's dequant needs) after the last e4m3 piece.
template <bool kV4, int kReload>
__device__ __forceinline__ void store_reload(uint32_t kt, int tok, int q, TokenPart<kV4>& r, const TokenRows& next) {
  const uint32_t row = kt + uint32_t(tok) * 128u;
  const uint32_t rope_flip = rope_order<kV4>(tok);
#pragma unroll
  for (int k = 0; k < TokenPart<kV4>::kN; ++k) {
    store_piece<kV4>(row, uint32_t(tok & 7), k, q, r);
    if (k < kReload) {
      r.v[k] = load_piece<kV4>(next, k, rope_flip);
    }
    if (k == TokenPart<kV4>::kFp8 - 1) {
      r.sc = load_scales<kV4>(next, q);
    }
  }
}

// Pieces k0 and up of a token's row.
template <bool kV4>
__device__ __forceinline__ void load_pieces(const TokenRows& t, int k0, uint32_t rope_flip, TokenPart<kV4>& r) {
#pragma unroll
  for (int k = 0; k < TokenPart<kV4>::kN; ++k) {
    if (k >= k0) {
      r.v[k] = load_piece<kV4>(t, k, rope_flip);
    }
  }
}

// The pieces of a token that the second tile of a pair reloads for the next pair's first tile (the head form,
// `producer`).
constexpr int kHeadPieces = 2;

template <bool kV4>
__device__ __forceinline__ void load_head(const TokenRows& t, int q, uint32_t rope_flip, TokenPart<kV4>& r) {
#pragma unroll
  for (int k = 0; k < kHeadPieces; ++k) {
    r.v[k] = load_piece<kV4>(t, k, rope_flip);
  }
  r.sc = load_scales<kV4>(t, q);
}

// Warpgroup 0: tile n's two half-tiles (tokens 32 h + tid / 4) from registers into stage n % 2, each
// register refilled with tile n + 1's piece; the slots read a tile ahead of their rows; tile n's mask bytes.
// Tiles go in pairs, one basic block a pair (the stage-free wait a named barrier, no polling loop), so that
// ptxas sees the second tile's uses of the loads the first issues and keeps them early: a load whose only use
// is in the next iteration it sinks to the loop's end. An odd count gets an all-invalid last tile (the math
// warpgroups count the same, math_work).
// The head form: the loads crossing the back edge all wait on one scoreboard at the next pair's first use, so
// the second tile of a pair reloads only kHeadPieces pieces and the scales of a token, and the next pair's first
// tile loads the rest at its top (load_pieces). SASS (nvcc 13.0, v32): the first wait 24 loads with 149 cycles of
// cover -> 8 with 434, every wait <= 8 loads. H100, graph replay, one split, same outputs bitwise: 135.5 ->
// 133.0 us b128 h64 s_q1, 128.8 -> 125.1 b64 h128 s_q1, 466.1 -> 452.8 b128 h128 s_q2, 254.0 -> 251.4 b128 h64
// s_q2 (v32); v4 137.2 -> 124.6 b128 h64 s_q1, 427.9 -> 422.8 b128 h128 s_q2.
template <bool kV4>
__device__ __forceinline__ void producer(const KernelArgs& a, uint32_t k_smem, uint8_t* masks, uint32_t full,
                                         int tid) {
  using C = Cfg<kV4>;
  const CtaWork w = cta_work(a);
  const CtaSpan sp = cta_span(a, w.b, w.i, w.split);
  const int count = max(sp.t1 - sp.t0, 0);
  if (count == 0) {
    return;
  }
  const int tok = tid_opaque() >> 2;
  const int q = tid & 3;
  const TokenRows first0 = token_rows<kV4>(a, load_slot(a, sp.idx_row, sp.t0, sp.t1, sp.n_end, tok), q);
  const TokenRows first1 = token_rows<kV4>(a, load_slot(a, sp.idx_row, sp.t0, sp.t1, sp.n_end, 32 + tok), q);
  uint32_t valid0 = first0.valid, valid1 = first1.valid;  // tile n's tokens
  int32_t slot0 = load_slot(a, sp.idx_row, sp.t0 + 1, sp.t1, sp.n_end, tok);  // -1 past the split: zero rows
  int32_t slot1 = load_slot(a, sp.idx_row, sp.t0 + 1, sp.t1, sp.n_end, 32 + tok);
  const uint32_t rope_flip = rope_order<kV4>(tok);
  TokenPart<kV4> r0, r1;  // before each pair: its first tile's head pieces and scales
  load_head<kV4>(first0, q, rope_flip, r0);
  load_head<kV4>(first1, q, rope_flip, r1);
  TokenRows tail0 = first0, tail1 = first1;  // the rows whose other pieces a first tile loads at its top
  auto tile = [&](int n, auto second) {
    constexpr bool kSecond = decltype(second)::value;
    if (!kSecond) {
      load_pieces<kV4>(tail0, kHeadPieces, rope_flip, r0);
      load_pieces<kV4>(tail1, kHeadPieces, rope_flip, r1);
    }
    const int st = n & 1;
    const uint32_t kt = k_smem + uint32_t(st) * C::L::kTileBytes;
    const TokenRows nx0 = token_rows<kV4>(a, slot0, q);
    const TokenRows nx1 = token_rows<kV4>(a, slot1, q);
    slot0 = load_slot(a, sp.idx_row, sp.t0 + n + 2, sp.t1, sp.n_end, tok);
    slot1 = load_slot(a, sp.idx_row, sp.t0 + n + 2, sp.t1, sp.n_end, 32 + tok);
    // Tile n's mask into slot n % 3: the QK warpgroup read it last for tile n - 3, before it released tile
    // n - 3's stage, which this warp waited for before storing tile n - 1.
    // Byte 4 h + warp of the slot: tokens 32 h + 8 warp + (0..7), this thread's tok & 7 among them.
    const uint32_t m0 = __reduce_or_sync(0xffffffffu, valid0 << (tok & 7));
    const uint32_t m1 = __reduce_or_sync(0xffffffffu, valid1 << (tok & 7));
    if ((tid & 31) == 0) {
      masks[8 * (n % kOffSlots) + (tok >> 3)] = uint8_t(m0);
      masks[8 * (n % kOffSlots) + 4 + (tok >> 3)] = uint8_t(m1);
    }
    bar_sync_converged(kBarEmpty + st, kEmptyThreads);  // the math is done with tile n - 2
    constexpr int kReload = kSecond ? kHeadPieces : TokenPart<kV4>::kN;
    store_reload<kV4, kReload>(kt, tok, q, r0, nx0);
    store_reload<kV4, kReload>(kt, 32 + tok, q, r1, nx1);
    fence_async_smem();  // this thread's stores -> the MMAs' async-proxy reads
    mbar_arrive(full + 8 * st);
    valid0 = nx0.valid;
    valid1 = nx1.valid;
    if (kSecond) {
      tail0 = nx0;
      tail1 = nx1;
    }
  };
  for (int n = 0; n < count; n += 2) {
    tile(n, std::false_type{});
    tile(n + 1, std::true_type{});
  }
}

// Both math roles: the CTA's work and its tile count (Q is staged before the role split), rounded up to a pair of
// tiles as the producer runs them.
__device__ __forceinline__ int math_work(const KernelArgs& a, CtaWork& w) {
  w = cta_work(a);
  const CtaSpan sp = cta_span(a, w.b, w.i, w.split);
  const int count = max(sp.t1 - sp.t0, 0);
  return (count + 1) & ~1;
}

// A math thread's release of tile n's stage once its warpgroup's PV(n) is done: an arrival on the producer's
// named barrier (none for the last two tiles, which the producer does not wait for).
__device__ __forceinline__ void release_stage(int n, int count) {
  if (n + 2 < count) {
    bar_arrive(kBarEmpty + (n & 1), kEmptyThreads);
  }
}

// Tile S(n) scaled in place, a masked score kNeg, and its rows' maxima over the quad. Bit 8 j + e of valid >> shift
// is column 8 j + 2 c + e: s[4 j + e] (row0), s[4 j + 2 + e] (row1) (shift 2 c, or 0 for a mask shifted already).
__device__ __forceinline__ void mask_scale_max(float (&s)[32], uint64_t valid, int shift, float qk_scale, float& mx0,
                                               float& mx1) {
  mx0 = kNeg;
  mx1 = kNeg;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const bool v = (valid >> (8 * j + shift + e)) & 1u;
      s[4 * j + e] = v ? s[4 * j + e] * qk_scale : kNeg;
      s[4 * j + 2 + e] = v ? s[4 * j + 2 + e] * qk_scale : kNeg;
      mx0 = fmaxf(mx0, s[4 * j + e]);
      mx1 = fmaxf(mx1, s[4 * j + 2 + e]);
    }
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
}

// Warpgroup 1: S = Q K^T, the online softmax, P and alpha to PV, O[:, 0:256]; the row statistics.
template <bool kV4, bool kSplit>
__device__ __forceinline__ void qk_role(const KernelArgs& a, uint32_t q_smem, uint32_t k_smem, uint32_t p_smem,
                                        const uint32_t* masks, float* row_f, uint32_t full, int mt, int c, int row0,
                                        int row1) {
  using C = Cfg<kV4>;
  CtaWork w;
  const int count = math_work(a, w);
  float o[128];
#pragma unroll
  for (int k = 0; k < 128; ++k) {
    o[k] = 0.f;
  }
  float m0 = kNeg, m1 = kNeg;  // running row max (log2 domain)
  float l0 = 0.f, l1 = 0.f;    // this thread's share of the row sums
  const uint64_t q_desc = sw128_desc(q_smem);
  float s[32];
  float al0 = 1.f, al1 = 1.f;
  // Softmax of tile n (S(n) in s): masked scores are kNeg after the scaling, so exp2(kNeg - max) is exactly 0 in a
  // row with a valid score so far and needs no second mask test; a row without one (max kNeg) subtracts 0
  // instead. exp2 in one MUFU.EX2 (ex2_ftz). 4 mask tests, 2 selects and ~4 range fix-ups fewer an element.
  // Lazy rescale (as FlashAttention 4 on Blackwell): a warp keeps its rows' running maxima until one grows by
  // more than kLazyGrowth, so P stays within 2^kLazyGrowth (bf16's relative precision at any magnitude) and O's
  // 128-register rescale is skipped in both warpgroups (PV sees alpha 1 in all the warp's rows).
  bool rescale = true;
  auto softmax = [&](int n) {
    const int sl = n % kOffSlots;
    const uint64_t valid = (uint64_t(masks[2 * sl]) | (uint64_t(masks[2 * sl + 1]) << 32)) >> (2 * c);
    float mx0, mx1;
    mask_scale_max(s, valid, 0, a.qk_scale, mx0, mx1);
    const float mn0 = fmaxf(m0, mx0);
    const float mn1 = fmaxf(m1, mx1);
    rescale = __any_sync(0xffffffffu, mn0 > m0 + kLazyGrowth || mn1 > m1 + kLazyGrowth);
    al0 = 1.f;
    al1 = 1.f;
    if (rescale) {
      al0 = ex2_ftz(m0 - mn0);
      al1 = ex2_ftz(m1 - mn1);
      m0 = mn0;
      m1 = mn1;
    }
    const float sub0 = m0 == kNeg ? 0.f : m0;
    const float sub1 = m1 == kNeg ? 0.f : m1;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int k = 0; k < 32; k += 4) {
      s[k] = ex2_ftz(s[k] - sub0);
      s[k + 1] = ex2_ftz(s[k + 1] - sub0);
      s[k + 2] = ex2_ftz(s[k + 2] - sub1);
      s[k + 3] = ex2_ftz(s[k + 3] - sub1);
      sum0 += s[k] + s[k + 1];
      sum1 += s[k + 2] + s[k + 3];
    }
    l0 = l0 * al0 + sum0;
    l1 = l1 * al1 + sum1;
  };
  // P(n) (bf16, K-major, 128-byte rows, 128-byte swizzle) and alpha(n) into shared memory, for PV.
  auto publish_p = [&]() {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      sts32(p_smem + uint32_t(row0) * 128u + ((uint32_t(j) ^ uint32_t(row0 & 7)) << 4) + 4u * uint32_t(c),
            pack_bf16(s[4 * j], s[4 * j + 1]));
      sts32(p_smem + uint32_t(row1) * 128u + ((uint32_t(j) ^ uint32_t(row1 & 7)) << 4) + 4u * uint32_t(c),
            pack_bf16(s[4 * j + 2], s[4 * j + 3]));
    }
    if (c == 0) {
      row_f[row0] = al0;
      row_f[row1] = al1;
    }
    fence_async_smem();
    handover(kBarPReady);
  };

  if (count > 0) {
    mbar_wait(full, 0u);
    __syncwarp();  // converged for the aligned barriers and wgmmas after the polling loop
    issue_qk<C::L::kBlocks>(s, q_desc, k_smem);
    wgmma_wait_all();
    fence_acc(s);
    softmax(0);
    publish_p();
  }
  // Tile n: PV(n) (P(n) and stage n only), then tile n + 1's stage wait and QK^T(n + 1); stage n released once PV(n)
  // is done; the softmax of n + 1. Nothing in flight across the loop's back edge (a wgmma pending there makes ptxas
  // serialise every wgmma, C7514).
  // Why PV first: with QK^T(n + 1) first (the earlier order), PV(n) waited for tile n + 1's stage, so stage n was
  // released, and refilled with tile n + 2, only after tile n + 1 was full: the producer's fill was on the math's
  // critical path. ncu (H100, b128 h128 s_q2 v32) of that order: the QK warpgroup waited on `full` in 12.0% of all
  // stall samples and the producer on a free stage in 8%; FlashMLA's math holds one stage at a time and its producer
  // waits for a free stage in 14%. PV first, same run, us (FlashMLA): b128 h128 s_q2 452.6 -> 418.8 (418.4), b128
  // h64 s_q1 133.8 -> 126.8 (~120); 5-8% at every v32 cell of batch 32-128, 7-10% v4, level at batch 1-4
  // (docs/design_attention.md). Predicted 5-20%.
  for (int n = 0; n + 1 < count; ++n) {
    const int st = n & 1;
    issue_pv(o, p_smem, k_smem + uint32_t(st) * C::L::kTileBytes, 0);
    mbar_wait(full + 8 * (st ^ 1), uint32_t((n + 1) >> 1) & 1u);
    __syncwarp();  // converged for the aligned barriers and wgmmas after the polling loop
    issue_qk<C::L::kBlocks>(s, q_desc, k_smem + uint32_t(st ^ 1) * C::L::kTileBytes);
    wgmma_wait_1();  // PV(n); S(n + 1) keeps running
    fence_acc(o);
    release_stage(n, count);
    wgmma_wait_all();  // S(n + 1)
    fence_acc(s);
    softmax(n + 1);
    handover(kBarPFree);  // PV's half of PV(n) done: P and row_f free
    publish_p();
    if (rescale) {
      scale_rows(o, al0, al1);
    }
  }
  if (count > 0) {
    issue_pv(o, p_smem, k_smem + uint32_t((count - 1) & 1) * C::L::kTileBytes, 0);
    wgmma_wait_all();
    fence_acc(o);  // (the last tile's stage is not released: the producer is done)
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);

  // Once PV has read the last alpha, the output scales go to it through row_f (the split path makes the same
  // handshake so that every barrier is matched).
  const int h0 = w.hb * kHeads + row0;
  const int h1 = w.hb * kHeads + row1;
  float inv0 = 0.f, inv1 = 0.f, lse0 = 0.f, lse1 = 0.f;
  if constexpr (!kSplit) {
    finish_row(m0, l0, a.sink, h0, inv0, lse0);
    finish_row(m1, l1, a.sink, h1, inv1, lse1);
  }
  if (count > 0) {
    handover(kBarPFree);
  }
  if (!kSplit && c == 0) {
    row_f[row0] = inv0;
    row_f[row1] = inv1;
  }
  handover(kBarPReady);
  if constexpr (kSplit) {
    const int64_t pidx = int64_t(w.prog) * a.splits + w.split;
    if (c == 0) {
      write_ml(a, pidx, row0, m0, l0);
      write_ml(a, pidx, row1, m1, l1);
    }
    if (count > 0) {  // the combine skips splits with sum 0, so empty ones write no partial
      store_partial(a, pidx, row0, row1, 2 * c, o);
    }
  } else {
    if (c == 0) {
      a.lse[(int64_t(w.b) * a.heads + h0) * a.s_q + w.i] = lse0;
      a.lse[(int64_t(w.b) * a.heads + h1) * a.s_q + w.i] = lse1;
    }
    store_out(a, w.b, w.i, h0, h1, 2 * c, inv0, inv1, o);
  }
}

// Warpgroup 2: O[:, 256:512] *= alpha(n); O += P(n) V(n).
template <bool kV4, bool kSplit>
__device__ __forceinline__ void pv_role(const KernelArgs& a, uint32_t q_smem, uint32_t k_smem, uint32_t p_smem,
                                        const float* row_f, uint32_t full, int mt, int c, int row0, int row1) {
  using C = Cfg<kV4>;
  CtaWork w;
  const int count = math_work(a, w);
  float o[128];
#pragma unroll
  for (int k = 0; k < 128; ++k) {
    o[k] = 0.f;
  }
  for (int n = 0; n < count; ++n) {
    const int st = n & 1;
    mbar_wait(full + 8 * st, uint32_t(n >> 1) & 1u);
    __syncwarp();  // converged for the aligned barriers and wgmmas after the polling loop
    handover(kBarPReady);  // P(n), alpha(n)
    const float al0 = row_f[row0], al1 = row_f[row1];
    if (__any_sync(0xffffffffu, al0 != 1.f || al1 != 1.f)) {  // the QK warp's lazy rescale
      scale_rows(o, al0, al1);
    }
    issue_pv(o, p_smem, k_smem + uint32_t(st) * C::L::kTileBytes, 1);
    wgmma_wait_all();
    fence_acc(o);
    release_stage(n, count);
    handover(kBarPFree);
  }
  handover(kBarPReady);  // the output scales
  const int col0 = 256 + 2 * c;
  if constexpr (kSplit) {
    if (count > 0) {
      store_partial(a, int64_t(w.prog) * a.splits + w.split, row0, row1, col0, o);
    }
  } else {
    store_out(a, w.b, w.i, w.hb * kHeads + row0, w.hb * kHeads + row1, col0, row_f[row0], row_f[row1], o);
  }
}

#endif  // DSA_SM90_INDEXER_DEVICE

template <bool kV4, bool kSplit>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_decode_ws_kernel(const __grid_constant__ KernelArgs a) {
#if DSA_SM90_INDEXER_DEVICE
  using C = Cfg<kV4>;
  const AlignedDynSmem smem;
  const uint32_t base = smem.addr;
  uint8_t* const base_ptr = smem.ptr;
  const uint32_t q_smem = base + C::kQOff;
  const uint32_t k_smem = base + C::kKOff;
  const uint32_t p_smem = base + C::kPOff;
  uint32_t* const masks = reinterpret_cast<uint32_t*>(base_ptr + C::kMaskOff);  // [kOffSlots][2]
  float* const row_f = reinterpret_cast<float*>(base_ptr + C::kRowOff);         // [64]
  const uint32_t full = base + C::kBarOff;

  const int tid = int(threadIdx.x);
  if (tid == 0) {
    for (int s = 0; s < 2; ++s) {
      mbar_init(full + 8 * s, kProducer);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  pdl_wait();
  pdl_launch_dependents();
  __syncthreads();  // the only CTA barrier: the mbarriers initialised

  if (tid < kProducer) {
    // ---------------- producer ----------------
    setmaxnreg_dec<kProducerRegs>();
    producer<kV4>(a, k_smem, reinterpret_cast<uint8_t*>(masks), full, tid);
    return;
  }

  // ---------------- math: QK (warpgroup 1) and PV (warpgroup 2) ----------------
  // Each role runs to its own exit from its setmaxnreg on (a path shared by two register budgets makes ptxas
  // drop the setmaxnreg).
  const int mt = tid - kProducer;
  const int warp = (mt >> 5) & 3;
  const int lane = mt & 31;
  const int g = lane >> 2;
  const int c = lane & 3;
  const int row0 = 16 * warp + g;  // this thread's accumulator rows (heads of the block)
  const int row1 = row0 + 8;
  {  // Q by both math warpgroups, before their register budgets part
    CtaWork w;
    if (math_work(a, w) > 0) {  // both stages start free (the count is even: 0 or at least 2)
      bar_arrive(kBarEmpty, kEmptyThreads);
      bar_arrive(kBarEmpty + 1, kEmptyThreads);
    }
    w = cta_work(a);
    stage_q<kV4, 256>(a, q_smem, w.b, w.i, w.hb, mt);
    asm volatile("cp.async.wait_all;" ::: "memory");
    fence_async_smem();
    bar_sync(kBarMath, 256);
  }
  if (mt < 128) {
    setmaxnreg_inc<kQkRegs>();
    qk_role<kV4, kSplit>(a, q_smem, k_smem, p_smem, masks, row_f, full, mt, c, row0, row1);
  } else {
    static_assert(kPvRegs == kLaunchRegs, "PV keeps the launch allocation");
    pv_role<kV4, kSplit>(a, q_smem, k_smem, p_smem, row_f, full, mt, c, row0, row1);
  }
#endif  // DSA_SM90_INDEXER_DEVICE
}

}  // namespace sm90_mla_decode_ws
}  // namespace dsa_cuda
