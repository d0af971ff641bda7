// The SM90 (Hopper, sm_90a) scoring core of the DSA indexer ops: what turns a 64-key tile of keys in
// shared memory and a Q tile (rows x heads) into one fp32 score per (key, row). Shared by
// indexer_logits (sm90_indexer_logits.cuh) and paged_indexer_logits (sm90_paged_indexer_logits.cuh),
// so both compute every score with the very same arithmetic. Everything here is wgmma-specific (the
// fragment and accumulator layouts): an SM100 (tcgen05) core is its own sm100_ file.
//
// The pieces, in the order a math warpgroup uses them on each tile:
// - stage_q_row: one Q row of the MMA's B operand [kN x D] into shared memory (128-byte swizzle,
//   K-major, D permuted to match the A fragments; e4m3 widened to fp16 in kFp8AsF16).
// - load_a_fragments: the thread's two key rows of a 64-key tile (rows stored 128-byte swizzled), as
//   the MMA's A fragments in registers (e4m3 widened to fp16 in kFp8AsF16).
// - mma_tile: D[64 x kN] = A[64 x D] * B[D x kN] with fp32 accumulation (wgmma, A from registers).
// - head_sums + quad_reduce_scatter: relu, head weights, sum over heads (in the thread, then across
//   the quad with xor shuffles), times the key scale: one score per (key, row).
//
// The depth axis D is permuted identically in A and B (a dot product does not care about order) so
// that each thread's A fragment for all k-steps is 32 contiguous bytes of each of its key rows.
//
// kN (the MMA's N: rows * heads of the Q tile) is 32, 64 or 128. A thread's accumulator then holds
// columns 8 i + 2 c + e (i < kN / 8, e < 2, c = lane % 4) of keys g and g + 8 (g = lane / 4 within
// the warp's 16): d[4 i + e] and d[4 i + 2 + e]. Column n is (row n / H, head n % H).
//
// Torch-free. Included by the SM90 kernel headers under __CUDACC__.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "smxx_indexer.cuh"
#include "smxx_mbarrier.cuh"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DSA_SM90_INDEXER_DEVICE 1
#else
#define DSA_SM90_INDEXER_DEVICE 0
#endif

namespace dsa_cuda {
namespace sm90_indexer {

using namespace smxx_indexer;  // kDim, kN, KernelArgs, Item, decode_item, the item cursors, small helpers

enum Mode : int { kFp8AsF16 = 0, kBf16 = 1, kFp8Mma = 2 };

constexpr int kWgKeys = 64;     // MMA M per warpgroup
constexpr int kMathBarrier = 1;  // named barrier of the math threads

// Operand sizes of a mode.
template <int kMode>
struct ModeTraits {
  static constexpr int kKvRowBytes = kMode == kBf16 ? 2 * kDim : kDim;  // bytes of a key row in a stage
  static constexpr int kKvChunks = kKvRowBytes / 16;
  static constexpr int kQRowBytes = kMode == kFp8Mma ? kDim : 2 * kDim;  // operand bytes per Q row
  static constexpr int kSteps = kMode == kFp8Mma ? kDim / 32 : kDim / 16;  // MMA k-steps over D
  static constexpr int kRowWords = kMode == kBf16 ? 16 : 8;  // u32 of a key row one thread reads
};

#if DSA_SM90_INDEXER_DEVICE

// setmaxnreg: every warp of a warpgroup executes it with the same count (a multiple of 8 in [24, 256]).
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

using smxx::mbar_arrive;  // smxx_mbarrier.cuh
using smxx::mbar_arrive_expect_tx;
using smxx::mbar_init;
using smxx::mbar_wait;

// The stage ring's mbarriers: `full` (kFullArrivals arrivals: 32 for a producer warp's cp.async, 1 for
// a bulk copy's expect_tx arrival) and `empty` (the math threads arrive), 8 bytes apart each. Ends with
// a CTA barrier.
template <int kStages, int kMathThreads, int kFullArrivals>
__device__ __forceinline__ void init_stage_barriers(uint32_t full, uint32_t empty) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full + s * 8, kFullArrivals);
      mbar_init(empty + s * 8, kMathThreads);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}

using smxx::cp_async16;  // smxx_memory.cuh
using smxx::cp_async_arrive;
using smxx::e4m3x2_to_f16x2;
using smxx::lds128;
using smxx::lds32;
using smxx::sts128;
using smxx::sts32;

template <int kMathThreads>
__device__ __forceinline__ void math_barrier() {
  asm volatile("bar.sync %0, %1;" ::"n"(kMathBarrier), "n"(kMathThreads) : "memory");
}

// Byte offset of (row n, K byte b) in a K-major tile of `rows` rows stored as 128-byte K blocks with
// the 128-byte swizzle: 16-byte chunk index XOR (row % 8), 8-row atoms of 1024 bytes.
__device__ __forceinline__ uint32_t sw128_offset(int n, int b, int rows) {
  return uint32_t((b >> 7) * rows * 128 + n * 128 + ((((b >> 4) & 7) ^ (n & 7)) << 4) + (b & 15));
}

// wgmma shared-memory descriptor: K-major, 128-byte swizzle, 8-row atoms 1024 bytes apart (SBO).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

// Keep the compiler from moving accumulator reads or writes across the async MMA boundary.
template <int kRegs>
__device__ __forceinline__ void fence_acc(float (&d)[kRegs]) {
#pragma unroll
  for (int i = 0; i < kRegs; ++i) {
    asm volatile("" : "+f"(d[i])::"memory");
  }
}

#define DSA_ACC8(b)                                                                                   \
  "+f"(d[b + 0]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), \
      "+f"(d[b + 6]), "+f"(d[b + 7])
#define DSA_ACC16 DSA_ACC8(0), DSA_ACC8(8)
#define DSA_ACC32 DSA_ACC16, DSA_ACC8(16), DSA_ACC8(24)
#define DSA_ACC64 DSA_ACC32, DSA_ACC8(32), DSA_ACC8(40), DSA_ACC8(48), DSA_ACC8(56)
#define DSA_REGS16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define DSA_REGS32                                                                                        \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define DSA_REGS64                                                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "  \
  "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
// A registers, descriptor, and the scale-d predicate's source, after kRegs accumulators.
#define DSA_AB16 ", {%16, %17, %18, %19}, %20, p, 1, 1"
#define DSA_AB32 ", {%32, %33, %34, %35}, %36, p, 1, 1"
#define DSA_AB64 ", {%64, %65, %66, %67}, %68, p, 1, 1"
#define DSA_PRED16 "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
#define DSA_PRED32 "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
#define DSA_PRED64 "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
// One wgmma instruction of N = n, accumulator size k (registers per thread), for each mode: e4m3 takes
// no transpose flag, f16 / bf16 take trans-b = 0 (K-major B).
#define DSA_WGMMA_RS(k, n)                                                                                       \
  if constexpr (kMode == kFp8Mma) {                                                                             \
    asm volatile(DSA_PRED##k "wgmma.mma_async.sync.aligned.m64n" #n "k32.f32.e4m3.e4m3 " DSA_REGS##k DSA_AB##k \
                             ";\n}\n"                                                                           \
                 : DSA_ACC##k                                                                                   \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(acc));                                     \
  } else if constexpr (kMode == kBf16) {                                                                        \
    asm volatile(DSA_PRED##k "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32.bf16.bf16 " DSA_REGS##k DSA_AB##k \
                             ", 0;\n}\n"                                                                        \
                 : DSA_ACC##k                                                                                   \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(acc));                                     \
  } else {                                                                                                      \
    asm volatile(DSA_PRED##k "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32.f16.f16 " DSA_REGS##k DSA_AB##k   \
                             ", 0;\n}\n"                                                                        \
                 : DSA_ACC##k                                                                                   \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(acc));                                     \
  }

// D[64 x kN] (+)= A[64 x k] (registers) * B[k x kN] (shared, descriptor); accumulate iff `acc`.
// The first step of a tile passes acc = 0, which zeroes D inside the MMA (no separate zeroing, which
// would make ptxas serialise the wgmma chain).
template <int kMode, int kN>
__device__ __forceinline__ void wgmma_rs(float (&d)[kN / 2], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint64_t desc, uint32_t acc) {
  static_assert(kN == 32 || kN == 64 || kN == 128, "MMA N is 32, 64 or 128");
  if constexpr (kN == 128) {
    DSA_WGMMA_RS(64, 128)
  } else if constexpr (kN == 64) {
    DSA_WGMMA_RS(32, 64)
  } else {
    DSA_WGMMA_RS(16, 32)
  }
}

#undef DSA_WGMMA_RS
#undef DSA_ACC8
#undef DSA_ACC16
#undef DSA_ACC32
#undef DSA_ACC64
#undef DSA_REGS16
#undef DSA_REGS32
#undef DSA_REGS64
#undef DSA_AB16
#undef DSA_AB32
#undef DSA_AB64
#undef DSA_PRED16
#undef DSA_PRED32
#undef DSA_PRED64

// Writes Q row n (of kN) of the MMA's B operand into shared memory at q_smem: this thread's half of it
// (D [64 half, 64 half + 64)) from `src_row` (that row's first element; zeros when !valid, and src_row
// is not read), D permuted to match the A fragments, widened to fp16 in kFp8AsF16. Two threads per row.
template <int kMode, int kN>
__device__ __forceinline__ void stage_q_row(bool valid, const uint8_t* src_row, int n, int half, uint32_t q_smem) {
  constexpr int kElem = kMode == kBf16 ? 2 : 1;
  constexpr int kVecs = 64 * kElem / 16;
  uint32_t w[kVecs * 4];
  if (valid) {
    const uint4* src = reinterpret_cast<const uint4*>(src_row + half * 64 * kElem);
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      const uint4 x = __ldg(src + v);
      w[4 * v + 0] = x.x;
      w[4 * v + 1] = x.y;
      w[4 * v + 2] = x.z;
      w[4 * v + 3] = x.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < kVecs * 4; ++k) {
      w[k] = 0;
    }
  }
  // Each output u32 goes to logical K byte 32 s + 16 sub + 4 c, c = the A-fragment lane column.
  if constexpr (kMode == kFp8AsF16) {
#pragma unroll
    for (int k = 0; k < 16; ++k) {  // word k: physical d = 64 half + 4 k = 32 c + 4 s + j
      const int c = 2 * half + k / 8, s = k % 8;
      sts32(q_smem + sw128_offset(n, 32 * s + 4 * c, kN), e4m3x2_to_f16x2(w[k] & 0xFFFF));
      sts32(q_smem + sw128_offset(n, 32 * s + 16 + 4 * c, kN), e4m3x2_to_f16x2(w[k] >> 16));
    }
  } else if constexpr (kMode == kFp8Mma) {
#pragma unroll
    for (int k = 0; k < 16; ++k) {  // physical d = 64 half + 4 k = 32 c + 8 s + 4 sub + j
      const int c = 2 * half + k / 8, s = (k % 8) / 2, sub = k % 2;
      sts32(q_smem + sw128_offset(n, 32 * s + 16 * sub + 4 * c, kN), w[k]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 32; ++k) {  // physical element 64 half + 2 k = 32 c + 4 s + 2 sub + j
      const int c = 2 * half + k / 16, s = (k % 16) / 2, sub = k % 2;
      sts32(q_smem + sw128_offset(n, 32 * s + 16 * sub + 4 * c, kN), w[k]);
    }
  }
}

// The A fragments of every k-step s, {row kr0 K-lo, row kr1 K-lo, row kr0 K-hi, row kr1 K-hi}, from
// the thread's words of its two key rows in K order (r0: row kr0, r1: row kr1); kFp8AsF16 widens e4m3
// to fp16 here.
template <int kMode>
__device__ __forceinline__ void fragments_from_words(const uint32_t (&r0)[ModeTraits<kMode>::kRowWords],
                                                     const uint32_t (&r1)[ModeTraits<kMode>::kRowWords],
                                                     uint32_t (&fa)[ModeTraits<kMode>::kSteps][4]) {
#pragma unroll
  for (int s = 0; s < ModeTraits<kMode>::kSteps; ++s) {
    if constexpr (kMode == kFp8AsF16) {
      fa[s][0] = e4m3x2_to_f16x2(r0[s] & 0xFFFF);
      fa[s][1] = e4m3x2_to_f16x2(r1[s] & 0xFFFF);
      fa[s][2] = e4m3x2_to_f16x2(r0[s] >> 16);
      fa[s][3] = e4m3x2_to_f16x2(r1[s] >> 16);
    } else {
      fa[s][0] = r0[2 * s];
      fa[s][1] = r1[2 * s];
      fa[s][2] = r0[2 * s + 1];
      fa[s][3] = r1[2 * s + 1];
    }
  }
}

// Chunk v of a row's words: w[4 v .. 4 v + 3] = x.
template <int kWords>
__device__ __forceinline__ void put_chunk(uint32_t (&w)[kWords], int v, const uint4& x) {
  w[4 * v + 0] = x.x;
  w[4 * v + 1] = x.y;
  w[4 * v + 2] = x.z;
  w[4 * v + 3] = x.w;
}

// The A fragments (fragments_from_words) of the thread's two key rows kr0, kr1 of the tile at tile_smem
// (rows of kKvRowBytes, 128-byte swizzled): chunks kChunks c .. kChunks c + kChunks - 1 of each row.
// c = lane % 4.
template <int kMode>
__device__ __forceinline__ void load_a_fragments(uint32_t tile_smem, int kr0, int kr1, int c,
                                                 uint32_t (&fa)[ModeTraits<kMode>::kSteps][4]) {
  using T = ModeTraits<kMode>;
  constexpr int kChunks = T::kRowWords / 4;
  uint32_t r0[T::kRowWords], r1[T::kRowWords];
#pragma unroll
  for (int v = 0; v < kChunks; ++v) {
    const int ch = kChunks * c + v;
    const uint4 x = lds128(tile_smem + kr0 * T::kKvRowBytes + ((ch ^ (kr0 & 7)) << 4));
    const uint4 y = lds128(tile_smem + kr1 * T::kKvRowBytes + ((ch ^ (kr1 & 7)) << 4));
    put_chunk(r0, v, x);
    put_chunk(r1, v, y);
  }
  fragments_from_words<kMode>(r0, r1, fa);
}

// acc = the tile's A fragments times the Q tile (B, descriptor q_desc of a [kN x D] K-major 128-byte
// swizzled tile), fp32 accumulation; returns once the MMAs have completed.
template <int kMode, int kN>
__device__ __forceinline__ void mma_tile(float (&acc)[kN / 2], const uint32_t (&fa)[ModeTraits<kMode>::kSteps][4],
                                         uint64_t q_desc) {
  fence_acc(acc);
  wgmma_fence();
#pragma unroll
  for (int s = 0; s < ModeTraits<kMode>::kSteps; ++s) {
    const int b = 32 * s;  // K byte offset of the step inside Q's 128-byte K blocks
    const uint32_t off = uint32_t((b >> 7) * kN * 128 + (b & 127));
    wgmma_rs<kMode, kN>(acc, fa[s][0], fa[s][1], fa[s][2], fa[s][3], q_desc + (off >> 4), s > 0 ? 1u : 0u);
  }
  wgmma_commit();
  wgmma_wait_all();
  fence_acc(acc);
}

// D[64 x 128] (+)= A[64 x 32] * B[32 x 128], e4m3, both operands in shared memory (descriptors);
// accumulate iff `acc` (0 on a tile's first step zeroes D inside the MMA, as in the core's wgmma_rs).
__device__ __forceinline__ void wgmma_ss_e4m3_n128(float (&d)[64], uint64_t a_desc, uint64_t b_desc, uint32_t acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, "
      "%43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a_desc), "l"(b_desc), "r"(acc));
}

// acc = the warpgroup's 64 key rows (descriptor a_desc) times the Q tile (q_desc), both K-major with the
// 128-byte swizzle and one 128-byte K block, so k-step s starts 32 s bytes in (descriptor + 2 s);
// returns once the MMAs have completed.
__device__ __forceinline__ void mma_tile_ss(float (&acc)[64], uint64_t a_desc, uint64_t q_desc) {
  fence_acc(acc);
  wgmma_fence();
#pragma unroll
  for (int s = 0; s < kDim / 32; ++s) {
    wgmma_ss_e4m3_n128(acc, a_desc + 2 * s, q_desc + 2 * s, s > 0 ? 1u : 0u);
  }
  wgmma_commit();
  wgmma_wait_all();
  fence_acc(acc);
}

// Whether some key of the warp has a negative scale (the signed epilogue). kLate (config 1): the test takes the
// MMA result's first element too; |x| >= 0 and fminf drops a NaN, so the answer is that of s0 < 0 || s1 < 0,
// but the test now follows the MMA wait. The early test lets ptxas hoist the scale compares, and with them the
// wait on the two scale loads, in front of the tile's 4th wgmma (static SASS: VOTE.ANY between the 3rd and
// 4th QGMMA; late: the 4 back to back). H200, 4096 x 32768 H 64, interleaved rounds beside DeepGEMM
// (tools/ab_indexer_logits.py): full 2371 -> 2199 us, causal 2258 -> 2116, 131072 causal 9475 -> 8989; H 32
// full within the rounds' spread (1145 -> 1260 us there, 1287 -> 1167 in the sweep). Scores bitwise the early
// test's. Configs 2 and 4 keep the early test (not measured with the late one).
template <bool kLate>
__device__ __forceinline__ bool any_negative_scale(float s0, float s1, float acc0) {
  if constexpr (kLate) {
    return __any_sync(0xffffffffu, fminf(fminf(s0, fabsf(acc0)), s1) < 0.f);
  } else {
    return __any_sync(0xffffffffu, s0 < 0.f || s1 < 0.f);
  }
}

// Writes Q row n of the MMA's B operand (fp8, [kN x 128] bytes) into shared memory at q_smem in natural D order,
// for A read by the tensor core from a stage as TMA stored it (mma_tile_ss): this thread's half (bytes [64 half,
// 64 half + 64)) of `src_row` (zeros when !valid, and src_row is not read), 128-byte swizzle. Two threads a row.
__device__ __forceinline__ void stage_q_row_natural(bool valid, const uint8_t* src_row, int n, int half,
                                                    uint32_t q_smem) {
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    const int j = 4 * half + v;  // 16-byte chunk of the row
    uint4 x = make_uint4(0u, 0u, 0u, 0u);
    if (valid) {
      x = __ldg(reinterpret_cast<const uint4*>(src_row) + j);
    }
    sts128(q_smem + uint32_t(n * 128 + ((j ^ (n & 7)) << 4)), x);
  }
}

// relu, weight, sum this thread's heads of each (key, row), then scale. v[kh * kRows + r], kh = 0 for
// key g, 1 for key g + 8; kRows = kN / kHeads.
// w[2 i + e] weights column 8 i + 2 c + e.
// kSigned: some key scale is negative, so relu(x * s) = s * min(x, 0) there (not s * max(x, 0)).
template <int kHeads, int kN, bool kSigned>
__device__ __forceinline__ void head_sums(const float (&d)[kN / 2], const float (&w)[kN / 4], float s0, float s1,
                                          float (&v)[2 * (kN / kHeads)]) {
  constexpr int kRows = kN / kHeads;
  float part[2][kRows][2];  // two chains per (key, row): half the dependent FMA latency
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      part[0][r][e] = 0.f;
      part[1][r][e] = 0.f;
    }
  }
#pragma unroll
  for (int i = 0; i < kN / 8; ++i) {
    const int r = (8 * i) / kHeads;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float wt = w[2 * i + e];
      const float x0 = d[4 * i + e];
      const float x1 = d[4 * i + 2 + e];
      float v0, v1;
      if constexpr (kSigned) {
        v0 = s0 < 0.f ? fminf(x0, 0.f) : fmaxf(x0, 0.f);
        v1 = s1 < 0.f ? fminf(x1, 0.f) : fmaxf(x1, 0.f);
      } else {
        v0 = fmaxf(x0, 0.f);
        v1 = fmaxf(x1, 0.f);
      }
      part[0][r][e] = fmaf(wt, v0, part[0][r][e]);
      part[1][r][e] = fmaf(wt, v1, part[1][r][e]);
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    v[r] = (part[0][r][0] + part[0][r][1]) * s0;
    v[kRows + r] = (part[1][r][0] + part[1][r][1]) * s1;
  }
}

// head_sums, its signed epilogue taken when any key of the warp has a negative scale (any_negative_scale;
// kLate: the test after the MMA wait).
template <int kHeads, int kN, bool kLate>
__device__ __forceinline__ void head_sums_by_sign(const float (&d)[kN / 2], const float (&w)[kN / 4], float s0,
                                                  float s1, float (&v)[2 * (kN / kHeads)]) {
  if (any_negative_scale<kLate>(s0, s1, d[0])) {
    head_sums<kHeads, kN, true>(d, w, s0, s1, v);
  } else {
    head_sums<kHeads, kN, false>(d, w, s0, s1, v);
  }
}

// Sum each of the quad's values over its 4 lanes, leaving lane c with the totals of v[4 b + c]
// (b < kValues / 4): a reduce-scatter, half the shuffles of an all-reduce.
template <int kValues>
__device__ __forceinline__ void quad_reduce_scatter(const float (&v)[kValues], int c, float (&out)[kValues / 4]) {
  static_assert(kValues % 4 == 0, "quad_reduce_scatter takes a multiple of 4 values");
  const bool hi2 = (c & 2) != 0;
  const bool hi1 = (c & 1) != 0;
#pragma unroll
  for (int b = 0; b < kValues / 4; ++b) {
    float keep[2];
#pragma unroll
    for (int q = 0; q < 2; ++q) {  // lanes c, c ^ 2: keep v[4b + q + 2 (c >> 1)], send the other
      const float lo = v[4 * b + q], hi = v[4 * b + q + 2];
      keep[q] = (hi2 ? hi : lo) + __shfl_xor_sync(0xffffffffu, hi2 ? lo : hi, 2);
    }
    out[b] = (hi1 ? keep[1] : keep[0]) + __shfl_xor_sync(0xffffffffu, hi1 ? keep[0] : keep[1], 1);
  }
}

// The quad sum of two values (one row: kRows = 1), in the same association as quad_reduce_scatter:
// ((lane c's + lane c ^ 2's) + (lane c ^ 1's + lane c ^ 3's)). Lanes c = 0, 1 get v[0]'s total, c = 2, 3
// v[1]'s (both lanes of a pair hold it; the caller stores from one).
__device__ __forceinline__ float quad_reduce_pair(const float (&v)[2], int c) {
  const bool hi2 = (c & 2) != 0;
  const float keep = (hi2 ? v[1] : v[0]) + __shfl_xor_sync(0xffffffffu, hi2 ? v[0] : v[1], 2);
  return keep + __shfl_xor_sync(0xffffffffu, keep, 1);
}

// A 64-key tile of a math warpgroup once its A fragments are in registers, to this thread's per-row
// head sums of its two keys (part[kh * kRows + r], before the quad reduction): arrive on `empty_bar`
// (the stage may be refilled), MMA against the Q tile, then relu, weights and key scales (s0 for key
// kr0, s1 for key kr1). The signed epilogue is taken when any key of the warp has a negative scale.
template <int kMode, int kHeads, int kN>
__device__ __forceinline__ void score_fragments(const uint32_t (&fa)[ModeTraits<kMode>::kSteps][4], uint32_t empty_bar,
                                                uint64_t q_desc, float (&acc)[kN / 2], const float (&w)[kN / 4],
                                                float s0, float s1, float (&part)[2 * (kN / kHeads)]) {
  mbar_arrive(empty_bar);  // the tile is in registers: the producer may refill the stage
  mma_tile<kMode, kN>(acc, fa, q_desc);
  head_sums_by_sign<kHeads, kN, false>(acc, w, s0, s1, part);
}

// One 64-key tile of a math warpgroup, from the stage in shared memory (load_a_fragments) through
// score_fragments.
template <int kMode, int kHeads, int kN>
__device__ __forceinline__ void score_tile(uint32_t tile_smem, int kr0, int kr1, int c, uint32_t empty_bar,
                                           uint64_t q_desc, float (&acc)[kN / 2], const float (&w)[kN / 4], float s0,
                                           float s1, float (&part)[2 * (kN / kHeads)]) {
  uint32_t fa[ModeTraits<kMode>::kSteps][4];
  load_a_fragments<kMode>(tile_smem, kr0, kr1, c, fa);
  score_fragments<kMode, kHeads, kN>(fa, empty_bar, q_desc, acc, w, s0, s1, part);
}

#endif  // DSA_SM90_INDEXER_DEVICE

}  // namespace sm90_indexer
}  // namespace dsa_cuda
