// dsa.sparse_mla_decode on Hopper (sm_90a): FlashMLA's sparse decode design with wgmma, both cache layouts.
//
// Work: one CTA = one query token (b, i) x one block of 64 heads x one split of its top-k positions
// (128 heads are two CTAs, adjacent in the grid so they read each token's cache bytes from L2 the
// second time). 1-D grid: ((b * s_q + i) * splits + split) * head blocks + head block.
//
// CTA: two warpgroups (256 threads), both math and both producers (the loaders of
// smxx_sparse_mla_decode.cuh, which holds everything not wgmma-specific: the slot offsets, the gather,
// the dequant into the bf16 K tile, the softmax arithmetic, the split-KV partials and the combine).
// - Q [64 heads x D] bf16 is staged once (cp.async) as the MMA's A operand: K-major, 128-byte swizzle,
//   D in 128-byte blocks of 64 columns, each block [64 rows x 128 B] = 8 KiB.
// - A tile is 64 selected positions. Their slots are turned into byte offsets by 64 threads two tiles
//   ahead; all 256 threads gather the tile and dequantise it into a bf16 K tile laid out as Q.
// - Double-buffered: tile t + 1's global loads are issued before tile t's QK^T, and dequantised into
//   the other K buffer while tile t's PV runs.
// - S = Q K^T: warpgroup w computes S[64 heads x tokens 32w .. 32w + 31] (wgmma m64n32k16, A and B
//   from shared memory, fp32), so QK^T is not computed twice.
// - Online softmax in fp32, base 2: the row max of the tile is exchanged between the warpgroups through
//   shared memory, so both rescale with the same factor.
// - O[64 x 512] += P V: P (bf16, [64 x 64], K-major swizzled) goes through shared memory; V is the
//   first 512 columns of the same K tile, the B operand MN-major (wgmma's transpose bit: the tile's
//   rows are tokens, the reduction axis). Warpgroup w owns output columns 256 w .. 256 w + 255
//   (m64n256k16: 128 fp32 accumulators a thread).
// - Split-KV: the split's unnormalised O, row max and row sum go to the workspace; the shared combine
//   kernel writes out and lse.
//
// Shared memory (v32; v4 has 8 column blocks, not 9): 1 KiB alignment slack + Q 72 KiB + two K tiles
// 2 x 72 KiB + P 8 KiB + tile offsets 2 x 64 x 8 B + row exchange 2 x 64 x 4 B = 231936 B of the
// 232448 B an SM90 CTA may have (v4: 208384 B with the extra scale offsets).
//
// What bounds it (H200): not the gather or the dequant. Halving both (the two CTAs of a 128-head token as a
// cluster, each dequantising half of a tile into both CTAs' shared memory) left the time unchanged (742.8
// -> 760.7 us at batch 128, 128 heads, s_q 2), an L2 prefetch 4 tiles ahead cost 7-15%, dequantising
// under QK^T instead of PV ~5%. Each tile is a serial chain (QK^T, the row-max exchange and softmax, P
// through shared memory, PV) with CTA-wide barriers between, one CTA an SM. The warp-specialised kernel
// (sm90_sparse_mla_decode_ws.cuh, launcher variant 1) is 3-18% faster from 64 (token, head block) programs
// and serves there; this one serves the few-program shapes (docs/design_attention.md).
//
// Torch-free. Included by sparse_mla_decode.cuh under __CUDACC__.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common_launch.cuh"
#include "sm90_indexer_core.cuh"  // wgmma helpers: sw128_desc, fences, commit / wait
#include "smxx_sparse_mla_decode.cuh"

namespace dsa_cuda {
namespace sm90_mla_decode {

using smxx_mla_decode::CombineArgs;
using smxx_mla_decode::KernelArgs;
using smxx_mla_decode::kBlockBytes;
using smxx_mla_decode::kDv;
using smxx_mla_decode::kHeads;
using smxx_mla_decode::kLog2e;
using smxx_mla_decode::kNeg;
using smxx_mla_decode::kTile;
using smxx_mla_decode::sparse_mla_combine_kernel;

constexpr int kThreads = smxx_mla_decode::kLoaders;  // two warpgroups, all of them loaders

// The shared layout plus the row exchange: fp32 [2 warpgroups][64].
template <bool kV4>
struct Cfg : smxx_mla_decode::Layout<kV4> {
  using L = smxx_mla_decode::Layout<kV4>;
  static constexpr int kRedOff = L::kOffsEnd;
  static constexpr int kSmemBytes = 1024 + kRedOff + 2 * kHeads * 4;
  static_assert(kSmemBytes <= 232448, "over the SM90 shared memory of a CTA");
};

#if DSA_SM90_INDEXER_DEVICE

using namespace smxx_mla_decode;
using sm90_indexer::fence_acc;
using sm90_indexer::sw128_desc;
using sm90_indexer::wgmma_commit;
using sm90_indexer::wgmma_fence;
using sm90_indexer::wgmma_wait_all;

// wgmma descriptor of an MN-major operand with the 128-byte swizzle: 64-element MN atoms LBO bytes
// apart, 8-row K groups 1024 bytes apart (SBO).
__device__ __forceinline__ uint64_t sw128_mn_desc(uint32_t addr, uint32_t lbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

// S[64 x 32] (+)= A * B, both from shared memory (K-major descriptors); accumulate iff `acc`.
__device__ __forceinline__ void wgmma_qk(float (&d)[16], uint64_t da, uint64_t db, uint32_t acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(acc));
}

#define DSA_O8(b)                                                                                     \
  "+f"(d[b + 0]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), \
      "+f"(d[b + 6]), "+f"(d[b + 7])
#define DSA_O32(b) DSA_O8(b), DSA_O8(b + 8), DSA_O8(b + 16), DSA_O8(b + 24)

// O[64 x 256] += A[64 x 16] * B[16 x 256]: A K-major, B MN-major (transpose bit), both in shared memory.
__device__ __forceinline__ void wgmma_pv(float (&d)[128], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, 0, 1;\n}\n"
      : DSA_O32(0), DSA_O32(32), DSA_O32(64), DSA_O32(96)
      : "l"(da), "l"(db), "r"(1u));
}

#undef DSA_O32
#undef DSA_O8

// O's rows row0 (o[4 k], o[4 k + 1]) and row1 (o[4 k + 2], o[4 k + 3]) of an m64n256 accumulator times al0, al1.
__device__ __forceinline__ void scale_rows(float (&o)[128], float al0, float al1) {
#pragma unroll
  for (int k = 0; k < 32; ++k) {
    o[4 * k + 0] *= al0;
    o[4 * k + 1] *= al0;
    o[4 * k + 2] *= al1;
    o[4 * k + 3] *= al1;
  }
}

// The split-KV partial of this thread's rows and columns col0 + 8 k + e.
__device__ __forceinline__ void store_partial(const KernelArgs& a, int64_t pidx, int row0, int row1, int col0,
                                              const float (&o)[128]) {
  float* p0 = smxx_mla_decode::part_at(a, pidx, row0, col0);
  float* p1 = smxx_mla_decode::part_at(a, pidx, row1, col0);
#pragma unroll
  for (int k = 0; k < 32; ++k) {
    *reinterpret_cast<float2*>(p0 + 8 * k) = make_float2(o[4 * k], o[4 * k + 1]);
    *reinterpret_cast<float2*>(p1 + 8 * k) = make_float2(o[4 * k + 2], o[4 * k + 3]);
  }
}

// Output rows h0, h1 of query token (b, i) (bf16, scaled by inv0 / inv1), columns col0 + 8 k + e.
__device__ __forceinline__ void store_out(const KernelArgs& a, int32_t b, int32_t i, int h0, int h1, int col0,
                                          float inv0, float inv1, const float (&o)[128]) {
  __nv_bfloat16* ob = a.out + int64_t(b) * a.o_sb + int64_t(i) * a.o_ss + col0;
  uint32_t* q0 = reinterpret_cast<uint32_t*>(ob + int64_t(h0) * a.o_sh);
  uint32_t* q1 = reinterpret_cast<uint32_t*>(ob + int64_t(h1) * a.o_sh);
#pragma unroll
  for (int k = 0; k < 32; ++k) {
    q0[4 * k] = smxx_mla_decode::pack_bf16(o[4 * k] * inv0, o[4 * k + 1] * inv0);
    q1[4 * k] = smxx_mla_decode::pack_bf16(o[4 * k + 2] * inv1, o[4 * k + 3] * inv1);
  }
}

#endif  // DSA_SM90_INDEXER_DEVICE

template <bool kV4, bool kSplit>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_decode_kernel(const __grid_constant__ KernelArgs a) {
#if DSA_SM90_INDEXER_DEVICE
  using C = Cfg<kV4>;
  const AlignedDynSmem smem;
  const uint32_t base = smem.addr;
  uint8_t* const base_ptr = smem.ptr;
  const uint32_t q_smem = base + C::kQOff;
  const uint32_t k_smem = base + C::kKOff;
  const uint32_t p_smem = base + C::kPOff;
  int64_t* const offs = reinterpret_cast<int64_t*>(base_ptr + C::kOffsOff);  // [2][kOffArrays * 64]
  float* const red = reinterpret_cast<float*>(base_ptr + C::kRedOff);          // [2][64]
  constexpr int kOffsStride = C::kOffArrays * kTile;

  const int tid = int(threadIdx.x);
  const int wg = tid >> 7;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int c = lane & 3;
  const int row0 = 16 * (warp & 3) + g;  // this thread's accumulator rows (heads of the block)
  const int row1 = row0 + 8;

  const auto [hb, split, b, i, prog] = cta_work(a);

  pdl_wait();
  pdl_launch_dependents();

  const auto [n_end, t0, t1, idx_row] = cta_span(a, b, i, split);

  stage_q<kV4, kThreads>(a, q_smem, b, i, hb, tid);  // Q block -> shared memory (cp.async)
  if (tid < kTile) {  // byte offsets of the first two tiles
    store_offsets<kV4>(a, load_slot(a, idx_row, t0, t1, n_end, tid), tid, offs);
    store_offsets<kV4>(a, load_slot(a, idx_row, t0 + 1, t1, n_end, tid), tid, offs + kOffsStride);
  }
  __syncthreads();
  if (t0 < t1) {
    Raw<kV4> r;
    load_tile<kV4>(a, offs, tid, r);
    store_tile<kV4>(k_smem, tid, r);
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  fence_async_smem();  // Q and the first tile (generic-proxy writes) -> the MMAs' async-proxy reads
  __syncthreads();

  float o[128];
#pragma unroll
  for (int k = 0; k < 128; ++k) {
    o[k] = 0.f;
  }
  float m0 = kNeg, m1 = kNeg;  // running row max (log2 domain) of rows row0, row1
  float l0 = 0.f, l1 = 0.f;    // this thread's share of the row sums
  const uint64_t q_desc = sw128_desc(q_smem);
  const uint64_t p_desc = sw128_desc(p_smem);

  for (int32_t t = t0; t < t1; ++t) {
    const int st = (t - t0) & 1;
    const uint32_t kt = k_smem + uint32_t(st) * C::kTileBytes;
    const bool has_next = t + 1 < t1;

    // 1. Tile t + 1's bytes and tile t + 2's slots: loads in flight through QK^T and the softmax.
    Raw<kV4> r;
    if (has_next) {
      load_tile<kV4>(a, offs + (st ^ 1) * kOffsStride, tid, r);
    }
    int32_t slot2 = -1;
    if (tid < kTile) {
      slot2 = load_slot(a, idx_row, t + 2, t1, n_end, tid);
    }

    // 2. S = Q K^T for this warpgroup's 32 tokens.
    float s[16];
    {
      const uint64_t k_desc = sw128_desc(kt + uint32_t(wg) * 32u * 128u);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < C::kBlocks * 4; ++ks) {
        const uint32_t off = uint32_t(ks >> 2) * kBlockBytes + uint32_t(ks & 3) * 32u;
        wgmma_qk(s, q_desc + (off >> 4), k_desc + (off >> 4), ks > 0 ? 1u : 0u);
      }
      wgmma_commit();
      wgmma_wait_all();
      fence_acc(s);
    }

    // 3. Online softmax. Column 8 j + 2 c + e of the warpgroup's 32: s[4 j + e] (row0), s[4 j + 2 + e] (row1).
    const int64_t* vo = offs + st * kOffsStride + 32 * wg;
    float mx0 = kNeg, mx1 = kNeg;
    uint32_t ok = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool v = vo[8 * j + 2 * c + e] >= 0;
        ok |= v ? 1u << (2 * j + e) : 0u;
        s[4 * j + e] = v ? s[4 * j + e] * a.qk_scale : kNeg;
        s[4 * j + 2 + e] = v ? s[4 * j + 2 + e] * a.qk_scale : kNeg;
        mx0 = fmaxf(mx0, s[4 * j + e]);
        mx1 = fmaxf(mx1, s[4 * j + 2 + e]);
      }
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    if (c == 0) {
      red[wg * kHeads + row0] = mx0;
      red[wg * kHeads + row1] = mx1;
    }
    __syncthreads();  // (A) both warpgroups' tile maxima
    const float mn0 = fmaxf(m0, fmaxf(mx0, red[(wg ^ 1) * kHeads + row0]));
    const float mn1 = fmaxf(m1, fmaxf(mx1, red[(wg ^ 1) * kHeads + row1]));
    const float al0 = exp2f(m0 - mn0);
    const float al1 = exp2f(m1 - mn1);
    m0 = mn0;
    m1 = mn1;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool v = (ok >> (2 * j + e)) & 1u;
        s[4 * j + e] = v ? exp2f(s[4 * j + e] - mn0) : 0.f;
        s[4 * j + 2 + e] = v ? exp2f(s[4 * j + 2 + e] - mn1) : 0.f;
        sum0 += s[4 * j + e];
        sum1 += s[4 * j + 2 + e];
      }
      // P[row, token 32 wg + 8 j + 2 c + e]: K-major, 128-byte rows, swizzled 16-byte chunk 4 wg + j.
      const uint32_t ch = uint32_t(4 * wg + j);
      sts32(p_smem + uint32_t(row0) * 128u + ((ch ^ uint32_t(row0 & 7)) << 4) + 4u * uint32_t(c),
            pack_bf16(s[4 * j], s[4 * j + 1]));
      sts32(p_smem + uint32_t(row1) * 128u + ((ch ^ uint32_t(row1 & 7)) << 4) + 4u * uint32_t(c),
            pack_bf16(s[4 * j + 2], s[4 * j + 3]));
    }
    l0 = l0 * al0 + sum0;
    l1 = l1 * al1 + sum1;
    scale_rows(o, al0, al1);
    fence_async_smem();
    __syncthreads();  // (B) P complete

    // 4. O += P V (this warpgroup's 256 columns), asynchronous while tile t + 1 is dequantised.
    {
      const uint64_t v_desc = sw128_mn_desc(kt + uint32_t(wg) * 4u * kBlockBytes, kBlockBytes);
      fence_acc(o);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        wgmma_pv(o, p_desc + ((uint32_t(kk) * 32u) >> 4), v_desc + ((uint32_t(kk) * 2048u) >> 4));
      }
      wgmma_commit();
    }
    if (tid < kTile) {  // tile t's offsets were last read before (A)
      store_offsets<kV4>(a, slot2, tid, offs + st * kOffsStride);
    }
    if (has_next) {
      store_tile<kV4>(k_smem + uint32_t(st ^ 1) * C::kTileBytes, tid, r);
    }
    fence_async_smem();
    wgmma_wait_all();
    fence_acc(o);
    __syncthreads();  // (C) tile t + 1 and tile t + 2's offsets visible; P and this K tile free
  }

  // Row sums: the quad's four shares, then the other warpgroup's 32 tokens.
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if (c == 0) {
    red[wg * kHeads + row0] = l0;
    red[wg * kHeads + row1] = l1;
  }
  __syncthreads();
  l0 += red[(wg ^ 1) * kHeads + row0];
  l1 += red[(wg ^ 1) * kHeads + row1];

  const int col0 = 256 * wg + 2 * c;  // column of o[4 k + e] is col0 + 8 k + e
  if constexpr (kSplit) {
    const int64_t pidx = int64_t(prog) * a.splits + split;
    if (wg == 0 && c == 0) {
      a.ml[pidx * 2 * kHeads + row0] = m0;
      a.ml[pidx * 2 * kHeads + row1] = m1;
      a.ml[pidx * 2 * kHeads + kHeads + row0] = l0;
      a.ml[pidx * 2 * kHeads + kHeads + row1] = l1;
    }
    if (t0 < t1) {  // the combine skips splits with sum 0, so empty ones write no partial
      store_partial(a, pidx, row0, row1, col0, o);
    }
  } else {
    const int h0 = hb * kHeads + row0;
    const int h1 = hb * kHeads + row1;
    float inv0, inv1, lse0, lse1;
    finish_row(m0, l0, a.sink, h0, inv0, lse0);
    finish_row(m1, l1, a.sink, h1, inv1, lse1);
    store_out(a, b, i, h0, h1, col0, inv0, inv1, o);
    if (wg == 0 && c == 0) {
      a.lse[(int64_t(b) * a.heads + h0) * a.s_q + i] = lse0;
      a.lse[(int64_t(b) * a.heads + h1) * a.s_q + i] = lse1;
    }
  }
#endif  // DSA_SM90_INDEXER_DEVICE
}

}  // namespace sm90_mla_decode
}  // namespace dsa_cuda
