// dsa.indexer_logits on Hopper (sm_90a): warpgroup MMA, warp-specialised, persistent.
//
// Work: an item is (R query rows, a chunk of key tiles), R = 128 / H, so a Q tile of R rows x H heads
// is the MMA's N = 128. Items are ordered chunk-major, so the CTAs running at one time share their
// keys in L2. A persistent grid (one CTA per SM) strides over the items.
//
// CTA: 2 (or 3) math warpgroups + 1 producer warp.
// - The producer streams 128-key (192-key) tiles of kv into a ring of shared-memory stages with cp.async
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
// Operand modes: kFp8AsF16 (default for fp8: e4m3 widened to fp16 exactly, fp16 MMA with fp32
// accumulation, meets the 1e-5 contract), kFp8Mma (e4m3 MMA: 2x the rate, ~14-bit accumulation inside
// the tensor core), kBf16.
//
// Torch-free. Included by indexer_logits.cuh under __CUDACC__.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common_launch.cuh"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DSA_SM90_INDEXER_DEVICE 1
#else
#define DSA_SM90_INDEXER_DEVICE 0
#endif

namespace dsa_cuda {
namespace sm90_indexer {

enum Mode : int { kFp8AsF16 = 0, kBf16 = 1, kFp8Mma = 2 };

constexpr int kWgKeys = 64;                               // MMA M per warpgroup
constexpr int kDim = 128;                                 // head dim D
constexpr int kN = 128;                                   // MMA N: rows * heads of a Q tile
constexpr int kMaxChunkTiles = 128;                       // key tiles per item at most
constexpr int kMathBarrier = 1;                           // named barrier of the math threads

// kWgs math warpgroups (2 or 3), each taking 64 keys of every pipeline stage.
template <int kMode, int kWgs>
struct Cfg {
  static constexpr int kMathThreads = 128 * kWgs;
  static constexpr int kThreads = kMathThreads + 32;  // + the producer warp
  static constexpr int kProducerWarp = kMathThreads / 32;
  static constexpr int kTileKeys = kWgKeys * kWgs;    // keys per pipeline stage
  static constexpr int kKvRowBytes = kMode == kBf16 ? 2 * kDim : kDim;
  static constexpr int kKvChunks = kKvRowBytes / 16;
  static constexpr int kStageBytes = kTileKeys * kKvRowBytes;
  static constexpr int kStages = kMode == kBf16 ? (kWgs == 2 ? 4 : 3) : 6;
  static constexpr int kQRowBytes = kMode == kFp8Mma ? kDim : 2 * kDim;  // operand bytes per Q row
  static constexpr int kQBytes = kN * kQRowBytes;
  static constexpr int kSteps = kMode == kFp8Mma ? kDim / 32 : kDim / 16;  // MMA k-steps over D
  static constexpr int kRowWords = kMode == kBf16 ? 16 : 8;  // u32 of a key row one thread reads
  // 3 warpgroups + the producer warp get 128 registers a thread: the item's head weights and row
  // windows then live in shared memory (read per tile) instead of registers.
  static constexpr bool kItemInSmem = kWgs > 2;
  // 1024 of slack: the swizzled tiles must start 1024-aligned in the shared window. Then Q, the
  // stages, the full / empty barriers, the item's weights (kN floats) and windows (4 x int2).
  static constexpr int kSmemBytes = 1024 + kQBytes + kStages * kStageBytes + 2 * kStages * 8 + kN * 4 + 32;
};

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

#if DSA_SM90_INDEXER_DEVICE

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// Arrive on `bar` once this thread's earlier cp.async have landed (counts against the expected count).
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// A load the compiler keeps in program order with the barrier waits (asm volatile), so it is in flight
// while the thread waits for its tile.
__device__ __forceinline__ float ldg_early(const float* p) {
  float v;
  asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ void sts32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}

template <int kMathThreads>
__device__ __forceinline__ void math_barrier() {
  asm volatile("bar.sync %0, %1;" ::"n"(kMathBarrier), "n"(kMathThreads) : "memory");
}

// Two e4m3 (low byte first) -> f16x2, exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t x) {
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(static_cast<uint16_t>(x)));
  return r;
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
__device__ __forceinline__ void fence_acc(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    asm volatile("" : "+f"(d[i])::"memory");
  }
}

#define DSA_ACC8(b)                                                                                   \
  "+f"(d[b + 0]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), \
      "+f"(d[b + 6]), "+f"(d[b + 7])
#define DSA_ACC64 \
  DSA_ACC8(0), DSA_ACC8(8), DSA_ACC8(16), DSA_ACC8(24), DSA_ACC8(32), DSA_ACC8(40), DSA_ACC8(48), DSA_ACC8(56)
#define DSA_ACC_REGS                                                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "  \
  "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// D[64 x 128] (+)= A[64 x k] (registers) * B[k x 128] (shared, descriptor); accumulate iff `acc`.
// The first step of a tile passes acc = 0, which zeroes D inside the MMA (no separate zeroing, which
// would make ptxas serialise the wgmma chain).
template <int kMode>
__device__ __forceinline__ void wgmma_rs(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint64_t desc, uint32_t acc) {
  if constexpr (kMode == kFp8Mma) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " DSA_ACC_REGS
        ", {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
        : DSA_ACC64
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(acc));
  } else if constexpr (kMode == kBf16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " DSA_ACC_REGS
        ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : DSA_ACC64
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(acc));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " DSA_ACC_REGS
        ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : DSA_ACC64
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(acc));
  }
}

#undef DSA_ACC8
#undef DSA_ACC64
#undef DSA_ACC_REGS

// This CTA's items: blockIdx.x, + gridDim.x, ... as (row block, chunk), stepped without divisions.
struct ItemCursor {
  int32_t rb, kc, step_rb, step_kc;
  __device__ __forceinline__ explicit ItemCursor(const KernelArgs& a) {
    rb = int32_t(blockIdx.x % uint32_t(a.row_blocks));
    kc = int32_t(blockIdx.x / uint32_t(a.row_blocks));
    step_rb = int32_t(gridDim.x % uint32_t(a.row_blocks));
    step_kc = int32_t(gridDim.x / uint32_t(a.row_blocks));
  }
  __device__ __forceinline__ bool valid(const KernelArgs& a) const { return kc < a.chunks; }
  __device__ __forceinline__ void next(const KernelArgs& a) {
    rb += step_rb;
    kc += step_kc;
    if (rb >= a.row_blocks) {
      rb -= a.row_blocks;
      ++kc;
    }
  }
};

template <int kRows, int kTileKeys>
__device__ __forceinline__ Item<kRows> decode_item(const KernelArgs& a, int32_t rb, int32_t kc) {
  Item<kRows> it;
  it.row0 = int64_t(rb) * kRows;
  const int32_t c0 = kc * a.chunk_tiles;
  const int32_t c1 = min(c0 + a.chunk_tiles, a.key_tiles);
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

template <int kMode, int kHeads, int kWgs>
__device__ __forceinline__ void producer(const KernelArgs& a, uint32_t stages, uint32_t full, uint32_t empty) {
  using C = Cfg<kMode, kWgs>;
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

// Writes the item's Q tile into shared memory as the MMA's B operand: row n = r * H + h, D permuted
// to match the A fragments (see the header comment), widened to fp16 in kFp8AsF16.
template <int kMode, int kHeads>
__device__ __forceinline__ void stage_q(const KernelArgs& a, int64_t row0, uint32_t q_smem) {
  const int tid = threadIdx.x;  // 0 .. 255: two threads per Q row, 64 of D each
  const int n = tid >> 1;
  const int half = tid & 1;
  const int64_t row = row0 + n / kHeads;
  const int h = n % kHeads;
  constexpr int kElem = kMode == kBf16 ? 2 : 1;
  constexpr int kVecs = 64 * kElem / 16;
  uint32_t w[kVecs * 4];
  if (row < a.rows) {
    const uint4* src = reinterpret_cast<const uint4*>(a.q + row * a.q_row_stride + h * a.q_head_stride +
                                                      half * 64 * kElem);
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

// relu, weight, sum this thread's heads of each (key, row), then scale. v[kh * kRows + r].
// kSigned: some key scale is negative, so relu(x * s) = s * min(x, 0) there (not s * max(x, 0)).
// kWSmem: the weights are read from shared memory at w_smem, 4 at a time as they are used
// (128-register variant); otherwise from `w`.
template <int kHeads, bool kSigned, bool kWSmem>
__device__ __forceinline__ void head_sums(const float (&d)[64], const float (&w)[32], uint32_t w_smem, float s0,
                                          float s1, float (&v)[2 * (kN / kHeads)]) {
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
  float ws[4];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int r = (8 * i) / kHeads;
    if constexpr (kWSmem) {
      if (i % 2 == 0) {
        const uint4 x = lds128(w_smem + i * 8);
        ws[0] = __uint_as_float(x.x);
        ws[1] = __uint_as_float(x.y);
        ws[2] = __uint_as_float(x.z);
        ws[3] = __uint_as_float(x.w);
      }
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float wt = kWSmem ? ws[2 * (i % 2) + e] : w[2 * i + e];
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

// Sum each of the quad's values over its 4 lanes, leaving lane c with the totals of v[4 b + c]
// (b < kValues / 4): a reduce-scatter, half the shuffles of an all-reduce.
template <int kValues>
__device__ __forceinline__ void quad_reduce_scatter(const float (&v)[kValues], int c, float (&out)[kValues / 4]) {
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

#endif  // DSA_SM90_INDEXER_DEVICE

template <int kMode, int kHeads, int kWgs>
__global__ void __launch_bounds__(Cfg<kMode, kWgs>::kThreads, 1)
    indexer_logits_kernel(const __grid_constant__ KernelArgs a) {
#if DSA_SM90_INDEXER_DEVICE
  using C = Cfg<kMode, kWgs>;
  constexpr int kTileKeys = C::kTileKeys;
  constexpr int kMathThreads = C::kMathThreads;
  constexpr int kRows = kN / kHeads;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t q_smem = base;
  const uint32_t stages = base + C::kQBytes;
  const uint32_t full = stages + C::kStages * C::kStageBytes;
  const uint32_t empty = full + C::kStages * 8;
  const uint32_t w_smem = empty + C::kStages * 8;  // [c][i][e]: lane column c's 32 weights contiguous
  const uint32_t win_smem = w_smem + kN * 4;       // [r]: (lo, hi) of the item's row r

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(full + s * 8, 32);
      mbar_init(empty + s * 8, kMathThreads);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  pdl_wait();
  pdl_launch_dependents();

  const int warp = threadIdx.x >> 5;
  if (warp == C::kProducerWarp) {
    producer<kMode, kHeads, kWgs>(a, stages, full, empty);
    return;
  }

  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;  // accumulator row within the warp's 16
  const int c = lane & 3;   // accumulator column pair
  const int kr0 = (warp >> 2) * kWgKeys + (warp & 3) * 16 + g;  // this thread's two keys in a tile
  const int kr1 = kr0 + 8;
  const float kNegInf = __int_as_float(int(0xff800000u));
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
    if constexpr (C::kItemInSmem) {
      if (threadIdx.x < kN) {  // thread c * 32 + 2 i + e writes column 8 i + 2 c + e
        const int cc = threadIdx.x >> 5, i = (threadIdx.x & 31) >> 1, e = threadIdx.x & 1;
        const int col = 8 * i + 2 * cc + e;
        const int64_t row = t.row0 + col / kHeads;
        const float v =
            row < a.rows ? __ldg(a.weights + row * a.w_row_stride + (col % kHeads) * a.w_head_stride) : 0.f;
        sts32(w_smem + threadIdx.x * 4, __float_as_uint(v));
      }
      if (threadIdx.x < kRows) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if (int(threadIdx.x) == r) {
            sts32(win_smem + r * 8, uint32_t(t.lo[r]));
            sts32(win_smem + r * 8 + 4, uint32_t(t.hi[r]));
          }
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = 8 * i + 2 * c + e;
          const int64_t row = t.row0 + col / kHeads;
          w[2 * i + e] =
              row < a.rows ? __ldg(a.weights + row * a.w_row_stride + (col % kHeads) * a.w_head_stride) : 0.f;
        }
      }
    }
    // Generic-proxy stores of Q must be visible to the MMA's async-proxy reads.
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    math_barrier<kMathThreads>();

    if (a.clean) {  // keys of the chunk outside the computed tiles: -inf, no math
      const int32_t ka = min(t.t0 * kTileKeys, t.k_end);
      const int32_t kz = min(t.t1 * kTileKeys, t.k_end);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int64_t row = t.row0 + r;
        if (row < a.rows) {
          float* o = a.out + row * a.out_row_stride;
          for (int32_t k = t.k_begin + int32_t(threadIdx.x); k < ka; k += kMathThreads) {
            o[k] = kNegInf;
          }
          for (int32_t k = kz + int32_t(threadIdx.x); k < t.k_end; k += kMathThreads) {
            o[k] = kNegInf;
          }
        }
      }
    }

    for (int32_t tile = t.t0; tile < t.t1; ++tile, ++it) {
      const uint32_t stage = it % C::kStages;
      const int32_t key0 = tile * kTileKeys;
      const int32_t key_a = key0 + kr0;
      const int32_t key_b = key0 + kr1;
      float s0 = 1.f, s1 = 1.f;
      if constexpr (kMode != kBf16) {
        const float x0 = ldg_early(a.kv_scale + int64_t(min(key_a, a.keys - 1)) * a.kv_scale_stride);
        const float x1 = ldg_early(a.kv_scale + int64_t(min(key_b, a.keys - 1)) * a.kv_scale_stride);
        s0 = key_a < a.keys ? x0 : 0.f;
        s1 = key_b < a.keys ? x1 : 0.f;
      }
      mbar_wait(full + stage * 8, (it / C::kStages) & 1);
      const uint32_t tile_smem = stages + stage * C::kStageBytes;
      // A fragments of k-step s: {row g K-lo, row g+8 K-lo, row g K-hi, row g+8 K-hi}, from the
      // thread's 16-byte chunks of its two key rows (kFp8AsF16 widens e4m3 to fp16 here).
      constexpr int kChunks = C::kRowWords / 4;
      uint32_t r0[C::kRowWords], r1[C::kRowWords];
#pragma unroll
      for (int v = 0; v < kChunks; ++v) {
        const int ch = kChunks * c + v;
        const uint4 x = lds128(tile_smem + kr0 * C::kKvRowBytes + ((ch ^ (kr0 & 7)) << 4));
        const uint4 y = lds128(tile_smem + kr1 * C::kKvRowBytes + ((ch ^ (kr1 & 7)) << 4));
        r0[4 * v + 0] = x.x;
        r0[4 * v + 1] = x.y;
        r0[4 * v + 2] = x.z;
        r0[4 * v + 3] = x.w;
        r1[4 * v + 0] = y.x;
        r1[4 * v + 1] = y.y;
        r1[4 * v + 2] = y.z;
        r1[4 * v + 3] = y.w;
      }
      uint32_t fa[C::kSteps][4];
#pragma unroll
      for (int s = 0; s < C::kSteps; ++s) {
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
      mbar_arrive(empty + stage * 8);  // the tile is in registers: the producer may refill the stage

      fence_acc(acc);
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < C::kSteps; ++s) {
        const int b = 32 * s;  // K byte offset of the step inside Q's 128-byte K blocks
        const uint32_t off = uint32_t((b >> 7) * kN * 128 + (b & 127));
        wgmma_rs<kMode>(acc, fa[s][0], fa[s][1], fa[s][2], fa[s][3], q_desc + (off >> 4), s > 0 ? 1u : 0u);
      }
      wgmma_commit();
      wgmma_wait_all();
      fence_acc(acc);

      float part[2 * kRows];
      const bool any_negative = __any_sync(0xffffffffu, s0 < 0.f || s1 < 0.f);
      if (any_negative) {
        head_sums<kHeads, true, C::kItemInSmem>(acc, w, w_smem + c * 128, s0, s1, part);
      } else {
        head_sums<kHeads, false, C::kItemInSmem>(acc, w, w_smem + c * 128, s0, s1, part);
      }
      float total[2 * kRows / 4];
      quad_reduce_scatter<2 * kRows>(part, c, total);
      // Lane c stores value 4 b + c = kh * kRows + r.
#pragma unroll
      for (int b = 0; b < 2 * kRows / 4; ++b) {
        const int v = 4 * b + c;
        const int kh = v / kRows;
        const int r = v % kRows;
        int32_t lo, hi;
        if constexpr (C::kItemInSmem) {
          lo = int32_t(lds32(win_smem + r * 8));
          hi = int32_t(lds32(win_smem + r * 8 + 4));
        } else {
          lo = t.lo[0];
          hi = t.hi[0];
#pragma unroll
          for (int rr = 1; rr < kRows; ++rr) {  // select, not a dynamic index (which would go to local memory)
            lo = r == rr ? t.lo[rr] : lo;
            hi = r == rr ? t.hi[rr] : hi;
          }
        }
        const int64_t row = t.row0 + r;
        const int32_t key = kh ? key_b : key_a;
        if (row < a.rows && key < a.keys) {
          a.out[row * a.out_row_stride + key] = key >= lo && key < hi ? total[b] : kNegInf;
        }
      }
    }
  }
#endif  // DSA_SM90_INDEXER_DEVICE
}

}  // namespace sm90_indexer
}  // namespace dsa_cuda
