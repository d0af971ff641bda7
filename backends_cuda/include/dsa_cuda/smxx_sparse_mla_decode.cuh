// dsa.sparse_mla_decode: what the Hopper (sm90_sparse_mla_decode.cuh, wgmma) and Blackwell
// (sm100_sparse_mla_decode.cuh, tcgen05) kernels share. Nothing here touches an MMA, an accumulator
// layout or tensor memory, so both kernels turn cache bytes into the same bf16 tiles, mask the same
// tokens and write the same split-KV partials, read back by the one combine kernel.
//
// - Work split: one CTA = one query token (b, i) x one block of 64 heads x one split of its top-k
//   positions; 1-D grid ((b * s_q + i) * splits + split) * head blocks + head block.
// - Slots -> byte offsets (load_slot, store_offsets): invalid when slot < 0, slot >= num_blocks * P or
//   position >= topk_lens[b]; an invalid slot gets offset -1 and no address is ever formed from it.
// - Gather (load_tile): 256 loader threads read a 64-token tile's cache bytes in 16-byte pieces into
//   registers; invalid tokens read nothing and give zero bytes and scale 0.
// - Dequant (store_tile): exactly the reference, bf16(f32(e4m3) * scale), into a bf16 K tile laid out
//   as the MMA operand: K-major, 128-byte swizzle, 128-byte column blocks of [64 rows x 128 B]; the rope
//   values are copied. Invalid tokens are zero rows (V must not be NaN there).
//   v32 (656 B a token): 512 e4m3, 4 fp32 scales (one per 128), 64 bf16 rope -> columns 0..575.
//   v4 (576 B a token + 8 B of scales elsewhere in the page): 448 e4m3 with one ue8m0 scale per 64,
//   64 bf16 rope -> columns 448..511 (so V holds the rope values too, as the reference's).
// - Softmax arithmetic: base 2 (log2(e) folded into qk_scale), masked tokens take the finite sentinel
//   kNeg and probability exactly 0, the running max starts at kNeg; finish_row turns a row's max and
//   sum into the output scale (attn_sink folded in) and the natural-log lse (+inf for a row with no
//   valid token, whose output is 0).
// - Split-KV: a split writes its unnormalised O [64 x 512] fp32, row max (log2) and row sum to the
//   workspace (part_row, write_ml); empty splits write sum 0 and no partial; the combine kernel weights
//   the splits by 2^(m_s - M) and writes out and lse.
//
// Torch-free. Included by the arch kernel headers under __CUDACC__.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common_launch.cuh"
#include "smxx_fast_div.cuh"
#include "smxx_memory.cuh"

// Device code of the shared pieces: sm_90 and newer (cp.async, cvt from e4m3x2, griddepcontrol).
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define DSA_SMXX_MLA_DEVICE 1
#else
#define DSA_SMXX_MLA_DEVICE 0
#endif

namespace dsa_cuda {
namespace smxx_mla_decode {

constexpr int kLoaders = 256;  // threads that gather and dequantise a tile
constexpr int kHeads = 64;     // heads a CTA: the MMA's M (QK^T)
constexpr int kTile = 64;      // selected positions a tile
constexpr int kDv = 512;       // output columns
constexpr int kBlockBytes = 64 * 128;  // one 128-byte column block of a 64-row operand
constexpr float kNeg = -1.0e30f;       // masked-score sentinel (log2 domain)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// A layout's tile geometry and the shared-memory offsets both kernels use from the 1024-aligned base:
// Q [64 x D], two K tiles, P [64 heads x 64 tokens] bf16, the tile offsets [2 buffers][kOffArrays][64].
template <bool kV4>
struct Layout {
  static constexpr int kDqk = kV4 ? 512 : 576;                   // q / K width
  static constexpr int kBlocks = kDqk / 64;                      // 128-byte column blocks of a row
  static constexpr int kTileBytes = kBlocks * kBlockBytes;       // 64 rows (Q or a K tile)
  static constexpr int kTokenBytes = kV4 ? 576 : 656;            // a token's e4m3 + rope bytes
  static constexpr int kFp8Pieces = kV4 ? 28 : 32;               // 16-byte e4m3 pieces of a token
  static constexpr int kRopeByte = kV4 ? 448 : 528;              // the rope values' byte offset
  static constexpr int kRopeBlock = kV4 ? 7 : 8;                 // their column block in the tile
  static constexpr int kPieces = kFp8Pieces + 8;                 // + 8 pieces of rope
  static constexpr int kUnits = kTile * kPieces / kLoaders;      // pieces a loader thread: 10 / 9
  static constexpr int kOffArrays = kV4 ? 2 : 1;                 // token offset (+ v4 scale offset)
  static constexpr int kQOff = 0;
  static constexpr int kKOff = kTileBytes;                       // two K tiles
  static constexpr int kPOff = kKOff + 2 * kTileBytes;
  static constexpr int kOffsOff = kPOff + kBlockBytes;           // int64 [2 buffers][kOffArrays][64]
  static constexpr int kOffsEnd = kOffsOff + 2 * kOffArrays * kTile * 8;
  static_assert(kTile * kPieces % kLoaders == 0, "pieces must divide evenly over the loader threads");
};

struct KernelArgs {
  const uint8_t* q;        // bf16 bytes
  const uint8_t* cache;
  const int32_t* idx;
  const int32_t* lens;     // nullptr: no topk_lens
  const float* sink;       // nullptr: no attn_sink
  __nv_bfloat16* out;
  float* lse;
  float* part;             // [programs * splits, 64, 512] (split-KV)
  float* ml;               // [programs * splits, 2, 64]   (split-KV)
  int64_t q_sb, q_ss, q_sh;        // elements
  int64_t i_sb, i_ss, i_sn;        // elements
  int64_t o_sb, o_ss, o_sh;        // elements
  int64_t lens_stride;             // elements
  int64_t page_stride;             // bytes
  int64_t nslots;                  // num_blocks * P
  int32_t s_q;
  int32_t heads;
  int32_t head_blocks;
  int32_t topk;
  int32_t page;                    // P
  uint32_t page_mul, page_shift;   // slot / P = fast_div(slot, page_mul, page_shift) (smxx_fast_div.cuh)
  int32_t splits;
  int32_t tiles_per_split;
  float qk_scale;                  // softmax_scale * log2(e)
  // Variant 3: 1 KiB of zeros that an invalid token's loads read (sm90_mla_decode_ws::kZeroRow, its address set by
  // the launcher: a parameter, where the symbol's own address came from a constant bank that missed in the
  // producer's loop).
  const uint8_t* zero_row;
};

struct CombineArgs {
  const float* part;
  const float* ml;
  const float* sink;
  __nv_bfloat16* out;
  float* lse;
  int64_t o_sb, o_ss, o_sh;
  int32_t s_q;
  int32_t heads;
  int32_t head_blocks;
  int32_t splits;
};

#if DSA_SMXX_MLA_DEVICE

// This CTA's work on the 1-D grid ((b * s_q + i) * splits + split) * head_blocks + hb: query token (b, i),
// head block hb, split; prog = the (query token, head block) pair.
struct CtaWork {
  int32_t hb, split, b, i, prog;
};
__device__ __forceinline__ CtaWork cta_work(const KernelArgs& a) {
  const int32_t hb = int32_t(blockIdx.x % uint32_t(a.head_blocks));
  const int32_t rest = int32_t(blockIdx.x / uint32_t(a.head_blocks));
  const int32_t split = rest % a.splits;
  const int32_t bi = rest / a.splits;
  const int32_t b = bi / a.s_q;
  const int32_t i = bi - b * a.s_q;
  return CtaWork{hb, split, b, i, bi * a.head_blocks + hb};
}

// The split's tiles [t0, t1) of the token's first n_end positions (topk_lens[b] clipped), and the token's
// index row. Reads topk_lens: call after pdl_wait.
struct CtaSpan {
  int32_t n_end, t0, t1;
  const int32_t* idx_row;
};
__device__ __forceinline__ CtaSpan cta_span(const KernelArgs& a, int32_t b, int32_t i, int32_t split) {
  int32_t n_end = a.topk;
  if (a.lens != nullptr) {
    n_end = min(max(__ldg(a.lens + int64_t(b) * a.lens_stride), 0), a.topk);
  }
  const int32_t tiles = (n_end + kTile - 1) / kTile;
  const int32_t t0 = split * a.tiles_per_split;
  return CtaSpan{n_end, t0, min(t0 + a.tiles_per_split, tiles), a.idx + int64_t(b) * a.i_sb + int64_t(i) * a.i_ss};
}

using smxx::AlignedDynSmem;  // smxx_memory.cuh
using smxx::cp_async16;
using smxx::e4m3x4_to_f16x4;
using smxx::ldg_early;
using smxx::smem_addr;
using smxx::sts32;

__device__ __forceinline__ void sts128(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

// Cache policies of the 16-byte gathers (global loads kept in program order with the MMAs by asm volatile:
// issued early, in flight meanwhile):
// - kStream: not allocated in L1 (variant 0's gather).
// - kKeep: the three-role kernel's (sm90_sparse_mla_decode_ws.cuh), FlashMLA's policy: allocated in L1 with
//   evict_last and a 256-byte L2 prefetch. A v32 token row (656 bytes) is 16-byte aligned, not 32, so two of its
//   pieces can share a sector, and its next pieces follow. H200, b128 h128 s_q 2: 592.0 -> 490.1 us (v32),
//   501.2 -> 467.9 (v4); 12-19% on v32 and 5-8% on v4 across FlashMLA's shapes.
// - kKeepNear: kKeep for the pieces past a v32 row's e4m3 bytes (scales, rope) and v4's rope: a 128-byte L2
//   prefetch, as FlashMLA's, since the row's end is near and a 256-byte one would reach into an unrelated slot.
enum class Ldg { kStream, kKeep, kKeepNear };

template <Ldg kPolicy>
__device__ __forceinline__ uint4 ldg128(const uint8_t* p) {
  uint4 v;
#define DSA_LDG128(qualifiers)                                                      \
  asm volatile("ld.global.nc." qualifiers ".v4.u32 {%0, %1, %2, %3}, [%4];"       \
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)                         \
               : "l"(p))
  if constexpr (kPolicy == Ldg::kStream) {
    DSA_LDG128("L1::no_allocate");
  } else if constexpr (kPolicy == Ldg::kKeep) {
    DSA_LDG128("L1::evict_last.L2::256B");
  } else {
    DSA_LDG128("L1::evict_last.L2::128B");
  }
#undef DSA_LDG128
  return v;
}

__device__ __forceinline__ uint2 ldg64(const uint8_t* p) {
  uint2 v;
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// 2^x for x <= 0 in one MUFU.EX2 (results below 2^-126 flush to 0, which a probability of a softmax row
// with a finite max can take: exp2f adds a range fix-up of 3-4 instructions an element for them).
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t ldg32(const uint8_t* p) {
  uint32_t v;
  asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t ldg8(const uint8_t* p) {
  uint16_t v;
  asm volatile("ld.global.nc.u8 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}

// Generic-proxy shared-memory writes -> the MMAs' async-proxy reads.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Four e4m3 (low byte first) as fp32, exact. The 16-bit split inside the asm lets F2FP read the upper half in
// place (one SHF fewer a word; H100: b128 h128 s_q2 v32 417.4 -> 408.7 us, 1-3% at batch 32-128,
// tools/ab_mla_flags.py).
__device__ __forceinline__ void e4m3x4_to_f32x4(uint32_t x, float2& f01, float2& f23) {
  uint32_t h01, h23;
  e4m3x4_to_f16x4(x, h01, h23);
  f01 = __half22float2(*reinterpret_cast<const __half2*>(&h01));
  f23 = __half22float2(*reinterpret_cast<const __half2*>(&h23));
}

// Four e4m3 (low byte first) times `scale`, as two bf16x2: bf16(f32(x) * scale), round to nearest even.
__device__ __forceinline__ void dequant4(uint32_t x, float scale, uint32_t& lo, uint32_t& hi) {
  float2 f01, f23;
  e4m3x4_to_f32x4(x, f01, f23);
  const __nv_bfloat162 b01 = __floats2bfloat162_rn(__fmul_rn(f01.x, scale), __fmul_rn(f01.y, scale));
  const __nv_bfloat162 b23 = __floats2bfloat162_rn(__fmul_rn(f23.x, scale), __fmul_rn(f23.y, scale));
  lo = *reinterpret_cast<const uint32_t*>(&b01);
  hi = *reinterpret_cast<const uint32_t*>(&b23);
}

// A ue8m0 byte's scale 2^(e - 127) as bf16x2, built from its bits as the reference's f32 (e = 0: the subnormal
// 2^-127; e = 255: inf); exact in bf16.
__device__ __forceinline__ uint32_t ue8m0_bf16x2(uint32_t e) {
  const uint32_t b = e == 0 ? 0x0040u : (e << 7);
  return b | (b << 16);
}

// dequant4 for a power-of-two scale (v4), bitwise the same: x is exact in bf16 and the reference's f32 product
// x * 2^k is exact (4 significant bits), so its one rounding to bf16 is the one rounding of a bf16 multiply
// (mul.rn.bf16x2 keeps subnormals). One HMUL2 for two values in place of two FMULs: H100, v4 at batch 32-128
// 2.5-3.7% faster (b128 h128 s_q2 373.5 -> 364.2 us; tools/ab_mla_flags.py), bitwise equal.
__device__ __forceinline__ void dequant4_pow2(uint32_t x, uint32_t scale2, uint32_t& lo, uint32_t& hi) {
  float2 f01, f23;
  e4m3x4_to_f32x4(x, f01, f23);
  const __nv_bfloat162 b01 = __floats2bfloat162_rn(f01.x, f01.y);  // exact
  const __nv_bfloat162 b23 = __floats2bfloat162_rn(f23.x, f23.y);
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(lo) : "r"(*reinterpret_cast<const uint32_t*>(&b01)), "r"(scale2));
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(hi) : "r"(*reinterpret_cast<const uint32_t*>(&b23)), "r"(scale2));
}

// Four words of e4m3 dequantised by one scale group's scale: w[0..7] as dequant4 gives them.
template <bool kV4>
__device__ __forceinline__ void dequant16(const uint4& v, uint32_t scale_bits, uint32_t (&w)[8]) {
  if constexpr (kV4) {
    const uint32_t s2 = ue8m0_bf16x2(scale_bits);
    dequant4_pow2(v.x, s2, w[0], w[1]);
    dequant4_pow2(v.y, s2, w[2], w[3]);
    dequant4_pow2(v.z, s2, w[4], w[5]);
    dequant4_pow2(v.w, s2, w[6], w[7]);
  } else {
    const float scale = __uint_as_float(scale_bits);
    dequant4(v.x, scale, w[0], w[1]);
    dequant4(v.y, scale, w[2], w[3]);
    dequant4(v.z, scale, w[4], w[5]);
    dequant4(v.w, scale, w[6], w[7]);
  }
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The Q block of (b, i, head block hb) -> shared memory at `q_smem` (cp.async, 16-byte pieces, K-major
// 128-byte swizzle), spread over `kN` threads of which this is `t`. The caller waits (cp.async.wait_all).
template <bool kV4, int kN>
__device__ __forceinline__ void stage_q(const KernelArgs& a, uint32_t q_smem, int32_t b, int32_t i, int32_t hb,
                                        int t) {
  using C = Layout<kV4>;
  const uint8_t* qb = a.q + 2 * (int64_t(b) * a.q_sb + int64_t(i) * a.q_ss + int64_t(hb) * kHeads * a.q_sh);
  constexpr int kRowPieces = C::kBlocks * 8;
  for (int u = t; u < kHeads * kRowPieces; u += kN) {
    const int hh = u / kRowPieces;
    const int pc = u - hh * kRowPieces;
    const uint32_t dst = q_smem + uint32_t(pc >> 3) * kBlockBytes + uint32_t(hh) * 128u +
                         ((uint32_t((pc & 7) ^ (hh & 7))) << 4);
    cp_async16(dst, qb + 2 * int64_t(hh) * a.q_sh + pc * 16, 16u);
  }
}

// Slot of tile position j (a thread < 64), -1 where the position is not to be read.
__device__ __forceinline__ int32_t load_slot(const KernelArgs& a, const int32_t* idx_row, int32_t tile, int32_t t1,
                                             int32_t n_end, int j) {
  const int32_t pos = tile * kTile + j;
  return tile < t1 && pos < n_end ? ldg_early(idx_row + int64_t(pos) * a.i_sn) : -1;
}

// The slot's byte offsets into `offs` (token data; v4 also its scales at offs[64 + j]): -1 when invalid.
template <bool kV4>
__device__ __forceinline__ void store_offsets(const KernelArgs& a, int32_t slot, int j, int64_t* offs) {
  using C = Layout<kV4>;
  int64_t tok = -1, sc = -1;
  if (slot >= 0 && int64_t(slot) < a.nslots) {
    const int32_t page = slot / a.page;
    const int32_t off = slot - page * a.page;
    const int64_t pb = int64_t(page) * a.page_stride;
    tok = pb + int64_t(off) * C::kTokenBytes;
    sc = pb + int64_t(a.page) * 576 + int64_t(off) * 8;
  }
  offs[j] = tok;
  if constexpr (kV4) {
    offs[kTile + j] = sc;
  }
}

// Token tok and piece pc of loader thread `t`'s piece k of a tile (k < kUnits): piece u = t + 256 k is
// token u / kPieces, piece u % kPieces (e4m3 pieces first, then rope).
template <bool kV4>
__device__ __forceinline__ void unit_piece(int t, int k, int& tok, int& pc) {
  const int u = t + kLoaders * k;
  tok = u / Layout<kV4>::kPieces;
  pc = u - tok * Layout<kV4>::kPieces;
}

// A loader thread's pieces of a tile (unit_piece), global -> registers. Invalid tokens: zero bytes and
// scale 0.
template <bool kV4>
struct Raw {
  uint4 v[Layout<kV4>::kUnits];
  uint32_t s[Layout<kV4>::kUnits];  // v32: fp32 scale bits; v4: the ue8m0 byte
};

template <bool kV4>
__device__ __forceinline__ void load_tile(const KernelArgs& a, const int64_t* offs, int t, Raw<kV4>& r) {
  using C = Layout<kV4>;
#pragma unroll
  for (int k = 0; k < C::kUnits; ++k) {
    int tok, pc;
    unit_piece<kV4>(t, k, tok, pc);
    const int64_t off = offs[tok];
    r.v[k] = make_uint4(0u, 0u, 0u, 0u);
    r.s[k] = 0u;
    if (off >= 0) {
      const uint8_t* p = a.cache + off;
      if (pc < C::kFp8Pieces) {
        r.v[k] = ldg128<Ldg::kStream>(p + pc * 16);
        if constexpr (kV4) {
          r.s[k] = ldg8(a.cache + offs[kTile + tok] + (pc >> 2));  // one scale per 64 values
        } else {
          r.s[k] = ldg32(p + 512 + 4 * (pc >> 3));  // one fp32 scale per 128 values
        }
      } else {
        r.v[k] = ldg128<Ldg::kStream>(p + C::kRopeByte + (pc - C::kFp8Pieces) * 16);
      }
    }
  }
}

// Pieces [kFrom, kTo) of loader thread `t`, registers -> the K tile at `kt` (bf16, K-major, 128-byte
// swizzle): 16 e4m3 give two 16-byte chunks.
template <bool kV4, int kFrom = 0, int kTo = Layout<kV4>::kUnits>
__device__ __forceinline__ void store_tile(uint32_t kt, int t, const Raw<kV4>& r) {
  using C = Layout<kV4>;
#pragma unroll
  for (int k = kFrom; k < kTo; ++k) {
    int tok, pc;
    unit_piece<kV4>(t, k, tok, pc);
    const uint32_t row = kt + uint32_t(tok) * 128u;
    const uint32_t sw = uint32_t(tok & 7);
    if (pc < C::kFp8Pieces) {
      uint32_t w[8];
      dequant16<kV4>(r.v[k], r.s[k], w);
      const uint32_t blk = row + uint32_t(pc >> 2) * kBlockBytes;  // 16 columns a piece, 64 a block
      const uint32_t c0 = uint32_t(pc & 3) * 2;
      sts128(blk + ((c0 ^ sw) << 4), w[0], w[1], w[2], w[3]);
      sts128(blk + (((c0 + 1) ^ sw) << 4), w[4], w[5], w[6], w[7]);
    } else {
      const uint32_t c0 = uint32_t(pc - C::kFp8Pieces);
      sts128(row + C::kRopeBlock * kBlockBytes + ((c0 ^ sw) << 4), r.v[k].x, r.v[k].y, r.v[k].z, r.v[k].w);
    }
  }
}

// The output scale of a row from its base-2 max m and sum l: 1 / l times the sink factor (0 for a row
// with no valid token), and the natural-log lse (+inf for such a row).
__device__ __forceinline__ void finish_row(float m, float l, const float* sink, int h, float& inv, float& lse) {
  const bool valid = l > 0.f;
  const float lse2 = m + __log2f(valid ? l : 1.f);
  inv = valid ? 1.f / l : 0.f;
  if (sink != nullptr && valid) {  // a tokenless row keeps 0 whatever the sink (NaN included)
    // exp(lse) / (exp(lse) + exp(sink)) = 1 / (1 + 2^(sink log2(e) - lse2))
    inv = inv / (1.f + exp2f(sink[h] * kLog2e - lse2));
  }
  lse = valid ? lse2 * kLn2 : __int_as_float(0x7f800000);
}

// Split-KV partial of (program, split) `pidx`: where row `row`, column `col` of its [64 x 512] fp32 goes.
__device__ __forceinline__ float* part_at(const KernelArgs& a, int64_t pidx, int row, int col) {
  return a.part + (pidx * kHeads + row) * kDv + col;
}

// Split-KV row max (log2 domain) and row sum of (program, split) `pidx`, row `row`.
__device__ __forceinline__ void write_ml(const KernelArgs& a, int64_t pidx, int row, float m, float l) {
  a.ml[pidx * 2 * kHeads + row] = m;
  a.ml[pidx * 2 * kHeads + kHeads + row] = l;
}

#endif  // DSA_SMXX_MLA_DEVICE

// One warp a head row: its 512 columns as 4 float4 a lane. CTA = 8 heads of one (query token, head block).
__global__ void __launch_bounds__(256) sparse_mla_combine_kernel(const __grid_constant__ CombineArgs a) {
#if DSA_SMXX_MLA_DEVICE
  pdl_wait();
  pdl_launch_dependents();
  const int warp = int(threadIdx.x >> 5);
  const int lane = int(threadIdx.x & 31);
  const int64_t prog = blockIdx.x >> 3;  // (query token, head block)
  const int row = int(blockIdx.x & 7) * 8 + warp;
  const float* ml = a.ml + prog * a.splits * 2 * kHeads;
  float mx = kNeg;
  for (int sp = 0; sp < a.splits; ++sp) {
    const float l = ml[sp * 2 * kHeads + kHeads + row];
    if (l > 0.f) {
      mx = fmaxf(mx, ml[sp * 2 * kHeads + row]);
    }
  }
  float4 acc[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float denom = 0.f;
  for (int sp = 0; sp < a.splits; ++sp) {
    const float l = ml[sp * 2 * kHeads + kHeads + row];
    if (l > 0.f) {  // warp-uniform; empty splits wrote no partial
      const float w = exp2f(ml[sp * 2 * kHeads + row] - mx);
      denom += w * l;
      const float4* p = reinterpret_cast<const float4*>(a.part + ((prog * a.splits + sp) * kHeads + row) * kDv);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float4 v = __ldg(p + lane + 32 * k);
        acc[k].x += w * v.x;
        acc[k].y += w * v.y;
        acc[k].z += w * v.z;
        acc[k].w += w * v.w;
      }
    }
  }
  const int32_t bi = int32_t(prog / a.head_blocks);
  const int32_t hb = int32_t(prog - int64_t(bi) * a.head_blocks);
  const int32_t b = bi / a.s_q;
  const int32_t i = bi - b * a.s_q;
  const int h = hb * kHeads + row;
  float inv, lse;
  finish_row(mx, denom, a.sink, h, inv, lse);
  __nv_bfloat16* ob = a.out + int64_t(b) * a.o_sb + int64_t(i) * a.o_ss + int64_t(h) * a.o_sh;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint2 w;
    w.x = pack_bf16(acc[k].x * inv, acc[k].y * inv);
    w.y = pack_bf16(acc[k].z * inv, acc[k].w * inv);
    *reinterpret_cast<uint2*>(ob + 4 * (lane + 32 * k)) = w;
  }
  if (lane == 0) {
    a.lse[(int64_t(b) * a.heads + h) * a.s_q + i] = lse;
  }
#endif  // DSA_SMXX_MLA_DEVICE
}

}  // namespace smxx_mla_decode
}  // namespace dsa_cuda
