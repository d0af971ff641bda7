// dsa.sparse_attention over an fp8 e4m3 paged cache: warp-level MMAs (mma.sync m16n8k16, fp16 in, fp32
// accumulate), cp.async gathers, no CTA barrier in the main loop. sm_90a runs it (the H200); sm_100a and
// sm_107a compile the same code (compiled, not run).
//
// - Occupancy: 128 registers and 16 warps an SM: CTAs of 4 warps (53 KiB of shared memory, 4 an SM) or of 16
//   (200 KiB, one an SM); q's MMA fragments sit in shared memory (an LDS.128 a k step) to free 32 registers (H200
//   1600 rows: 563.0 -> 531.8 us against 3 CTAs with q in registers and 4 stages).
// - Work: a unit is one query row x one KV head x one split of its top-k positions, unit (row * Hkv + kv
//   head) * splits + split. A CTA's warps take a unit's 16-token steps in turn (warp w: steps w, w + kWarps,
//   ...), each with its own online softmax, and merge at the unit's end. The launcher runs 16-warp CTAs for one
//   wave of unsplit units (a unit alone on an SM gathers with 16 warps, not 4), 4-warp CTAs otherwise.
// - Split tail (whole > 0): units 0 .. whole - 1 are items 0 .. whole - 1 unsplit (written out directly),
//   unit whole + v is item whole + v / splits, split v % splits (a partial). One CTA a unit, so the block
//   scheduler hands the tail's small units to slots as the first wave's CTAs end.
// - Persistent grid (4-warp CTAs, one split and 24 steps or more): a CTA per slot (4 an SM) takes units blockIdx.x +
//   k gridDim.x. A warp's lookahead runs on into the next unit, so its positions, block ids and first two
//   copies are in flight under the current unit's last steps: a CTA's start and end had cost its slot
//   ~20 us of ~80 under load (H200, 264 rows: 1 / 2 / 4 / 8 splits 97.6 / 130.4 / 173.3 / 268.3 us). The
//   merge goes in two halves through each warp's free stage (the other two hold the next unit's copies).
// - A warp's step: the 16 tokens' K and V codes (128 B each) land by cp.async in the warp's own ring
//   of kStages stages (4 KiB each, 2 steps in flight); only __syncwarp orders the ring. Page lookups
//   (index -> block table) run ahead of the copies, so each dependent load has two steps' compute to land
//   in. Invalid tokens (negative index, page slot past the table, block id outside the cache, position
//   past top-k, a padding row's) get probability exactly 0 and no address is formed from them. In a unit's
//   first kStages steps their rows are zero-filled; later they copy nothing and keep that unit's own stale
//   bytes. A step without a valid token is skipped.
// - QK^T: the group's query heads (<= 16) are the MMA M side. The thread's K bytes of a token are two
//   16-byte chunks (16 t and 64 + 16 t); each 4-byte word gives one k16 step's B fragment as two
//   e4m3x2 -> f16x2 converts. q's columns are loaded in the same permuted order, so the dot product
//   is unchanged. Each head's q is scaled by a power of two into fp16 (exact for bf16 values within 2^-28
//   of that head's largest), its scores scaled back in fp32.
// - PV: P (fp16, from the score accumulators as the A fragment) times V. A thread's B fragments need
//   pairs of tokens for one value column; it loads 16 bytes (one chunk) of 4 tokens and byte-permutes
//   (prmt) them into pairs, so its column n of MMA tile j is value column 16 n + j. The output is
//   un-permuted when it is written.
// - Softmax: base 2 (log2 e folded into the score scale), masked scores the finite sentinel kNeg,
//   running max starting there (as the Triton kernel: no exp2(-inf + inf)); the accumulator is rescaled
//   only when some row's max ran kRescaleSlack past the max it is scaled to (warp vote).
//
// Torch-free. Included by sparse_attention.cuh under __CUDACC__.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common_launch.cuh"
#include "smxx_memory.cuh"

#ifdef DSA_SA_TRACE
#include <cstdio>
#endif

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define DSA_SMXX_SA_DEVICE 1
#else
#define DSA_SMXX_SA_DEVICE 0
#endif

namespace dsa_cuda {
namespace smxx_sparse_attention {

constexpr int kD = 128;       // q / K head dim and V head dim
constexpr int kHeads = 16;    // MMA M: a KV head's query group, padded
constexpr int kStep = 16;     // tokens a warp step
constexpr int kStages = 3;    // a warp's ring: 2 steps in flight while it computes one
constexpr int kStageBytes = 2 * kStep * kD;  // K then V codes of 16 tokens
constexpr int kMergeHalfBytes = kHeads * (kD / 2) * 4;  // a warp's O, half its columns: [16][64] fp32
constexpr int kMergeThreads = 128;  // thread (head row, 16-column block) of the merge: 16 x 8
constexpr int kCombineThreads = 128;
constexpr int kWarpsPerSm = 16;  // 128 registers a thread
// A row max may run ahead of the max the accumulator is scaled to by up to this much (log2 domain) before
// the warp rescales: p <= 2^8 stays exact enough in fp16 and the sums in fp32, and the rescale (64 FMULs)
// runs a few times a row instead of at most steps.
constexpr float kRescaleSlack = 8.0f;
constexpr float kNeg = -1.0e30f;
static_assert(kMergeHalfBytes <= kStageBytes, "a merge half goes through a warp's free stage");

// A CTA of kWarps warps (4: 4 CTAs an SM, 53 KiB each; 16: one CTA an SM, 200 KiB) and its shared memory.
template <int kWarps>
struct Cta {
  static_assert(kWarps == 4 || kWarps == 16, "4 or 16 warps a CTA");
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kPerSm = kWarpsPerSm / kWarps;
  static constexpr int kRingBytes = kWarps * kStages * kStageBytes;
  static constexpr int kMaskOff = kRingBytes;                    // uint32 [kWarps][kStages]: valid-token bits
  static constexpr int kTableOff = kMaskOff + kWarps * kStages * 4;  // uint64 [kWarps][32]: row addresses
  static constexpr int kQOff = kTableOff + kWarps * 32 * 8;     // uint32 [8 k steps][32 lanes][4]: q's A fragments
  static constexpr int kSmemBytes = kQOff + 8 * 32 * 16;
  // A CTA takes several units (persistent grid) only with one split and at least this many steps: each warp
  // then has kStages + 3 steps or more a unit, so its lookahead reaches the next unit at most.
  static constexpr int kMultiUnitMinSteps = kWarps * (kStages + 3);
  static_assert(kTableOff % 16 == 0 && kSmemBytes <= 227 * 1024, "shared memory layout");
};

#ifdef DSA_SA_TRACE
// Dev builds only (-DDSA_SA_TRACE; tools/profile_sparse_attention.py trace): thread 0's %globaltimer at the
// kernel's start, after the prologue (q staged, the first copies issued) and at each unit's end, kept in a
// global table; the grid's last CTA prints it, one line a CTA. (Printing as each CTA ended stalled the CTAs
// still running: at 400 rows on the H200 second units read 60-900 us, against 42-53 us with the table.)
constexpr int kTraceMax = 8;
constexpr int kTraceCtas = 4096;
__device__ unsigned long long g_trace[kTraceCtas][kTraceMax + 1];  // [0]: smid << 32 | stamps
__device__ unsigned int g_trace_done;
#endif

struct KernelArgs {
  const __nv_bfloat16* q;
  const uint8_t* k;        // e4m3 codes
  const uint8_t* v;
  const int32_t* idx;
  const int32_t* bt;
  const int32_t* t2r;
  __nv_bfloat16* out;
  float* part;             // split path: [items * splits][16][128] unnormalised outputs
  float* ml;               // split path: [items * splits][2][16] running max (log2) and sum
  int64_t units;           // whole + (items - whole) * splits
  int64_t whole;           // leading items run unsplit (split tail; 0 otherwise)
  int64_t q_st, q_sh;      // elements
  int64_t k_sb, k_sp, k_sh, v_sb, v_sp, v_sh;  // bytes
  int64_t i_st, i_sn, bt_sr, bt_sp, t2r_s, o_st, o_sh;
  int32_t topk, num_blocks, num_reqs, max_pages, page;
  int32_t page_shift;      // log2(page) when a power of two, else -1
  int32_t group, hkv, splits, steps_per_split;
  int32_t out_aligned16;   // out's data and row / head strides 16-byte aligned: 16-byte stores
  float qk_scale;          // softmax_scale * k_scale * log2(e)
  float out_scale;         // v_scale
};

struct CombineArgs {
  const float* part;
  const float* ml;
  __nv_bfloat16* out;
  int64_t o_st, o_sh;
  int64_t item0;           // the first split item (the split tail's whole)
  int32_t group, hkv, splits;
  float out_scale;
};

#if DSA_SMXX_SA_DEVICE

using smxx::cp_async16;
using smxx::e4m3x4_to_f16x4;
using smxx::ldg_if;
using smxx::lds128;
using smxx::lds32;
using smxx::smem_addr;
using smxx::sts32;

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.f16x2.f32 %0, %2, %1;" : "=r"(d) : "f"(lo), "f"(hi));
  return d;
}

__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Swizzled 16-byte chunk positions of a 128-byte token row: conflict-free for the K reads (tokens g, g + 1
// at chunks t / 4 + t) and the V reads (tokens 2 t, 2 t + 1, ... at chunk g).
__device__ __forceinline__ uint32_t k_chunk(int row, int c) { return uint32_t(row * 128 + ((c ^ ((row & 1) << 2)) << 4)); }
__device__ __forceinline__ uint32_t v_chunk(int row, int c) { return uint32_t(row * 128 + ((c ^ (row & 7)) << 4)); }

// A lane's token of a step: lanes 0-15 address the K row of token `lane`, lanes 16-31 the V row of token
// `lane - 16`. load_pos reads the request-relative position (-1: none), load_page its block id and the
// offset inside the page (block -1: none), row_ptr the row's address (nullptr: invalid).
__device__ __forceinline__ int32_t load_pos(const KernelArgs& a, const int32_t* idx_row, int32_t step, int32_t end,
                                            int lane) {
  const int32_t n = step * kStep + (lane & 15);
  return ldg_if(step < end && n < a.topk, idx_row + int64_t(n) * a.i_sn, -1);
}

__device__ __forceinline__ int32_t load_page(const KernelArgs& a, const int32_t* bt_row, int32_t pos, int32_t& off) {
  const int32_t ps = pos < 0 ? a.max_pages : a.page_shift >= 0 ? pos >> a.page_shift : pos / a.page;
  off = pos - ps * a.page;
  return ldg_if(ps < a.max_pages, bt_row + int64_t(ps) * a.bt_sp, -1);
}

// The global address of this lane's row (K for lanes 0-15, V for 16-31), nullptr when the token is invalid.
__device__ __forceinline__ const uint8_t* row_ptr(const KernelArgs& a, int32_t page, int32_t off, int h, int lane) {
  if (page < 0 || page >= a.num_blocks) {
    return nullptr;
  }
  // Select the cache first, then one address computation: the K and V halves of the warp would otherwise run
  // two divergent paths in turn.
  const bool k = lane < 16;
  const uint8_t* base = k ? a.k : a.v;
  const int64_t sb = k ? a.k_sb : a.v_sb, sp = k ? a.k_sp : a.v_sp, sh = k ? a.k_sh : a.v_sh;
  return base + (int64_t(page) * sb + int64_t(off) * sp + int64_t(h) * sh);
}

__device__ __forceinline__ void cp_async16_if(bool p, uint32_t dst, const void* src) {
  asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\n@q cp.async.cg.shared.global [%0], [%1], 16;\n}\n" ::"r"(dst),
               "l"(src), "r"(int(p))
               : "memory");
}

// Copy one step's 16 K and 16 V rows into `stage`; lane L copies chunk L % 8 of rows L / 8 + 4 i. The lanes'
// row addresses go through the warp's table in shared memory (slot 4 (r % 4) + r / 4 for token r, V after K),
// so a lane reads its 4 K and 4 V addresses with 4 LDS.128 (16 64-bit shuffles took 22% of the loop's MIO
// stalls). Invalid rows copy nothing, and the softmax gives them probability exactly 0: their stage bytes stay
// stale, which is safe while they are this unit's own earlier tokens' (finite or not, they only meet p = 0 in
// rows whose result they already reach). So a unit's first kStages steps zero-fill invalid rows instead
// (kZeroFill: 16-byte copies of 0 source bytes from `fallback`, a valid address).
template <bool kZeroFill>
__device__ __forceinline__ uint32_t issue_step(uint32_t stage, uint32_t table, const uint8_t* row, int lane,
                                               const uint8_t* fallback) {
  const uint32_t valid = __ballot_sync(0xffffffffu, row != nullptr) & 0xffffu;
  const int r = lane & 15;
  asm volatile("st.shared.b64 [%0], %1;" ::"r"(table + 8 * ((lane & 16) + 4 * (r & 3) + (r >> 2))),
               "l"(reinterpret_cast<uint64_t>(row))
               : "memory");
  __syncwarp();
  const uint32_t mine = table + 32 * (lane >> 3);
  uint64_t kp[4], vp[4];
  asm volatile("ld.shared.v2.b64 {%0, %1}, [%2];" : "=l"(kp[0]), "=l"(kp[1]) : "r"(mine) : "memory");
  asm volatile("ld.shared.v2.b64 {%0, %1}, [%2];" : "=l"(kp[2]), "=l"(kp[3]) : "r"(mine + 16) : "memory");
  asm volatile("ld.shared.v2.b64 {%0, %1}, [%2];" : "=l"(vp[0]), "=l"(vp[1]) : "r"(mine + 128) : "memory");
  asm volatile("ld.shared.v2.b64 {%0, %1}, [%2];" : "=l"(vp[2]), "=l"(vp[3]) : "r"(mine + 144) : "memory");
  __syncwarp();
  const int c = lane & 7;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row_i = 4 * i + (lane >> 3);
    const uint32_t kd = stage + k_chunk(row_i, c), vd = stage + kStep * kD + v_chunk(row_i, c);
    const uint8_t* ks = reinterpret_cast<const uint8_t*>(kp[i]) + 16 * c;
    const uint8_t* vs = reinterpret_cast<const uint8_t*>(vp[i]) + 16 * c;
    if constexpr (kZeroFill) {
      cp_async16(kd, kp[i] != 0 ? ks : fallback, kp[i] != 0 ? 16u : 0u);
      cp_async16(vd, vp[i] != 0 ? vs : fallback, vp[i] != 0 ? 16u : 0u);
    } else {
      cp_async16_if(kp[i] != 0, kd, ks);
      cp_async16_if(vp[i] != 0, vd, vs);
    }
  }
  return valid;
}

// out[c0 .. c0 + 16) of one head row = acc * inv, as bf16.
__device__ __forceinline__ void store_row16(__nv_bfloat16* dst, const float (&acc)[16], float inv) {
#pragma unroll
  for (int c = 0; c < 16; ++c) {
    dst[c] = __float2bfloat16_rn(acc[c] * inv);
  }
}


// This thread's q fragments of (row, KV head h) as fp16, scaled by a power of two, into the CTA's q slots
// (warp 0 writes them; the caller orders the write against the readers); returns the score scales that
// undo the powers of two of rows g (x) and g + 8 (y). q rows g and g + 8, columns 16 t + [0, 16) and
// 64 + 16 t + [0, 16).
__device__ __forceinline__ float2 stage_q(const KernelArgs& a, int64_t row, int h, uint32_t qs, int warp, int g,
                                          int t) {
  float qf[2][32];
  float qmax[2] = {0.f, 0.f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int hr = g + 8 * r;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        uint4 w = make_uint4(0u, 0u, 0u, 0u);
        if (hr < a.group) {
          w = __ldg(reinterpret_cast<const uint4*>(a.q + row * a.q_st + int64_t(h * a.group + hr) * a.q_sh +
                                                   64 * half + 16 * t + 8 * c));
        }
        const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float lo = __uint_as_float(ws[e] << 16);
          const float hi = __uint_as_float(ws[e] & 0xffff0000u);
          qf[r][16 * half + 8 * c + 2 * e] = lo;
          qf[r][16 * half + 8 * c + 2 * e + 1] = hi;
          qmax[r] = fmaxf(qmax[r], fmaxf(fabsf(lo), fabsf(hi)));
        }
      }
    }
  }
  // Scale each head's q (rows g, g + 8: the four lanes t of a quad hold a row) by 2^sh so its largest element
  // lies in [2^14, 2^15): fp16 then holds every bf16 value of the head exactly down to 2^-28 of it. Per head,
  // not per group: a head far larger (or inf) must not flush the others to zero. NaN / inf q: the exponent
  // field is 255 and that head's scores come out NaN, as the reference's.
  float up[2], down[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    qmax[r] = fmaxf(qmax[r], __shfl_xor_sync(0xffffffffu, qmax[r], 1));
    qmax[r] = fmaxf(qmax[r], __shfl_xor_sync(0xffffffffu, qmax[r], 2));
    const int e = int((__float_as_uint(qmax[r]) >> 23) & 0xffu) - 127;
    const int sh = min(max(14 - e, -126), 126);
    up[r] = __uint_as_float(uint32_t(sh + 127) << 23);
    down[r] = __uint_as_float(uint32_t(127 - sh) << 23);
  }
  // At k step kk = 4 half + kq a lane's regs (row g, k 2t..), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..)
  // hold q columns 64 half + 16 t + 4 kq + {0, 1} (rows g, g + 8) and + {2, 3}; slot 512 kk + 16 lane.
  if (warp == 0) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const int b = 16 * (kk >> 2) + 4 * (kk & 3);
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(qs + 512u * kk),
                   "r"(pack_f16(qf[0][b] * up[0], qf[0][b + 1] * up[0])),
                   "r"(pack_f16(qf[1][b] * up[1], qf[1][b + 1] * up[1])),
                   "r"(pack_f16(qf[0][b + 2] * up[0], qf[0][b + 3] * up[0])),
                   "r"(pack_f16(qf[1][b + 2] * up[1], qf[1][b + 3] * up[1]))
                   : "memory");
    }
  }
  return make_float2(a.qk_scale * down[0], a.qk_scale * down[1]);
}

// The warps' merge goes through each warp's free stage in two halves (half 0: value columns 16 n + [0, 8),
// half 1: 16 n + [8, 16) for MMA column n), as [16 head rows][64] fp32. write_half stores this thread's O of
// one half; sum_half gives thread (hr, n) the 8 columns of head row hr over the warps, weighted.
template <int kHalf>
__device__ __forceinline__ void write_half(const float (&o)[16][4], uint32_t stage, int g, int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const uint32_t dst = stage + uint32_t(((g + 8 * r) * 64 + 8 * (2 * t + c)) * 4);
#pragma unroll
      for (int q4 = 0; q4 < 2; ++q4) {
        const int j = 8 * kHalf + 4 * q4;
        asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(dst + 16u * q4), "f"(o[j][2 * r + c]),
                     "f"(o[j + 1][2 * r + c]), "f"(o[j + 2][2 * r + c]), "f"(o[j + 3][2 * r + c])
                     : "memory");
      }
    }
  }
}

// Thread (hr, n)'s 8 columns of head row hr summed over the warps, each weighted by 2^(m_w - mm). A warp's
// table (smem_base + kTableOff + 256 w) holds its row maxima and sums (8 bytes a head row) and, at byte 128, its
// free stage; they are read where they are used, so 16 warps' values take no registers across the sum.
template <int kWarps>
__device__ __forceinline__ void sum_half(uint32_t tables, float mm, int hr, int n, float (&acc)[8]) {
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    acc[c] = 0.f;
  }
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const uint32_t tw = tables + uint32_t(w * 32 * 8);
    float mw;
    uint32_t stage;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(mw) : "r"(tw + 8u * hr));
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(stage) : "r"(tw + 128u));
    const float wt = exp2f(mw - mm);
    const uint32_t src = stage + uint32_t((hr * 64 + 8 * n) * 4);
    float v[8];
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "r"(src));
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v[4]), "=f"(v[5]), "=f"(v[6]), "=f"(v[7])
                 : "r"(src + 16u));
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      acc[c] += wt * v[c];
    }
  }
}

// 8 merged columns [col, col + 8) of head row hr: fp32 partials of split unit `piece`, or bf16 outputs times
// inv.
__device__ __forceinline__ void store_cols8(const KernelArgs& a, const float (&acc)[8], int col, float inv,
                                            bool partial, int64_t piece, int64_t row, int h, int hr) {
  if (partial) {
    float* dst = a.part + (piece * kHeads + hr) * kD + col;
    *reinterpret_cast<float4*>(dst) = make_float4(acc[0], acc[1], acc[2], acc[3]);
    *reinterpret_cast<float4*>(dst + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
  } else if (hr < a.group) {
    __nv_bfloat16* dst = a.out + row * a.o_st + int64_t(h * a.group + hr) * a.o_sh + col;
    if (a.out_aligned16) {
      uint32_t packed[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const __nv_bfloat162 b2 = __floats2bfloat162_rn(acc[2 * c] * inv, acc[2 * c + 1] * inv);
        packed[c] = *reinterpret_cast<const uint32_t*>(&b2);
      }
      *reinterpret_cast<uint4*>(dst) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    } else {
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        dst[c] = __float2bfloat16_rn(acc[c] * inv);
      }
    }
  }
}

#endif  // DSA_SMXX_SA_DEVICE

template <int kWarps>
__global__ void __launch_bounds__(Cta<kWarps>::kThreads, Cta<kWarps>::kPerSm)
    sparse_attention_fp8_kernel(const __grid_constant__ KernelArgs a) {
#if DSA_SMXX_SA_DEVICE
  using C = Cta<kWarps>;
  extern __shared__ __align__(128) uint8_t smem[];
  const int lane = int(threadIdx.x & 31);
  const int warp = __shfl_sync(0xffffffffu, int(threadIdx.x >> 5), 0);
  const int g = lane >> 2;
  const int t = lane & 3;
  uint32_t smem_base = smem_addr(smem);
  asm volatile("" : "+r"(smem_base));
  const uint32_t qs = smem_base + uint32_t(C::kQOff) + 16u * uint32_t(lane);
  const uint32_t ring = smem_base + uint32_t(warp * kStages * kStageBytes);
  const uint32_t masks = smem_base + uint32_t(C::kMaskOff + warp * kStages * 4);
  const uint32_t table = smem_base + uint32_t(C::kTableOff + warp * 32 * 8);

  pdl_wait();
#ifdef DSA_SA_TRACE
  unsigned long long trace_ns[kTraceMax] = {};
  int trace_n = 0;
  const auto stamp = [&] {
    if (threadIdx.x == 0 && trace_n < kTraceMax) {
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(trace_ns[trace_n]));
      ++trace_n;
    }
  };
  stamp();
#endif
  const int32_t steps = (a.topk + kStep - 1) / kStep;
  // Units u = blockIdx.x + k gridDim.x: (item, split) = (u / splits, u % splits), past the whole ones of a
  // split tail. More than one unit a CTA only with one split, no split tail and kMultiUnitMinSteps steps or
  // more (the launcher's rule): every unit then gives each warp the same n >= kStages + 3 steps, and the
  // lookahead never reaches past the next unit.
  int64_t unit = blockIdx.x;
  const int64_t stride = gridDim.x;
  const bool unsplit = unit < a.whole;
  const int64_t piece = unit - a.whole;  // index of a split unit's partial
  const int32_t split = unsplit ? 0 : int32_t(piece % a.splits);
  const int64_t item = unsplit ? unit : a.whole + piece / a.splits;  // row * hkv + kv head
  int64_t row = item / a.hkv;
  int h = int(item - row * a.hkv);
  const int32_t s0 = split * a.steps_per_split;
  const int32_t s1 = unsplit ? steps : min(s0 + a.steps_per_split, steps);
  // This warp's steps of a unit: first + kWarps j for j < n. A padding row runs them with every token invalid.
  const int32_t first = s0 + warp;
  const int32_t n = s1 > first ? (s1 - first + kWarps - 1) / kWarps : 0;
  const bool multi = unit + stride < a.units;
  int64_t nrow = 0;
  int nh = 0;
  if (multi) {
    const int64_t nitem = unit + stride;
    nrow = nitem / a.hkv;
    nh = int(nitem - nrow * a.hkv);
  }
  bool has_next = multi;
  // Requests of this unit, the next and the one after (loaded a unit before the boundary that needs it).
  const int32_t req = ldg_if(true, a.t2r + row * a.t2r_s, -1);
  int32_t nreq = ldg_if(has_next, a.t2r + nrow * a.t2r_s, -1);
  int32_t nnreq = -1;
  if (unit + 2 * stride < a.units) {
    nnreq = ldg_if(true, a.t2r + (unit + 2 * stride) / a.hkv * a.t2r_s, -1);
  }
  const int32_t* idx_row = a.idx + row * a.i_st;
  const int32_t* nidx_row = a.idx + nrow * a.i_st;
  bool req_ok = req >= 0 && req < a.num_reqs;
  bool nreq_ok = nreq >= 0 && nreq < a.num_reqs;
  const int32_t* bt_row = a.bt + int64_t(req_ok ? req : 0) * a.bt_sr;
  const int32_t* nbt_row = a.bt + int64_t(nreq_ok ? nreq : 0) * a.bt_sr;

  // Position of this warp's step j counted from the current unit's first (steps past n are the next unit's).
  // Not gated on the request (a padding row's positions are read and dropped at page_of), so the first
  // positions load beside token_to_req instead of after it.
  auto pos_of = [&](int32_t j) {
    if (j < n) {
      return load_pos(a, idx_row, first + kWarps * j, s1, lane);
    }
    const int32_t jn = j - n;
    return load_pos(a, nidx_row, warp + kWarps * jn, has_next && jn < n ? steps : 0, lane);
  };
  // Block id and page offset of a position of the current unit (cur) or the next; none for a padding row.
  auto page_of = [&](bool cur, int32_t pos, int32_t& off) {
    return load_page(a, cur ? bt_row : nbt_row, (cur ? req_ok : nreq_ok) ? pos : -1, off);
  };
  // The first lookups in flight together: the prologue waits for one position load, then one block-id load.
  constexpr int kAhead = kStages + 3;  // positions of steps 0 .. kStages + 2
  int32_t pos[kAhead];
#pragma unroll
  for (int j = 0; j < kAhead; ++j) {
    pos[j] = pos_of(j);
  }
  int32_t page[kStages + 1], poff[kStages + 1];
#pragma unroll
  for (int j = 0; j <= kStages; ++j) {
    page[j] = page_of(j < n, pos[j], poff[j]);
  }
  float2 qk_scale = stage_q(a, row, h, qs, warp, g, t);
  __syncthreads();

  // Prologue: steps 0 .. kStages - 2 resolved and issued; the block ids of steps kStages - 1 and kStages and
  // the positions of steps kStages + 1 and kStages + 2 in flight: each dependent lookup has two steps of
  // compute to land in (with one, the block-id load was the loop's largest stall under ncu). The first
  // kStages steps of every unit zero-fill invalid rows, so a stage's stale bytes are always this unit's.
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    const uint32_t valid =
        issue_step<true>(ring + j * kStageBytes, table, row_ptr(a, page[j], poff[j], j < n ? h : nh, lane), lane,
                         a.k);
    if (lane == 0) {
      sts32(masks + 4 * j, valid);
    }
    cp_async_commit();
  }
  int32_t page1 = page[kStages - 1], off1 = poff[kStages - 1];
  int32_t page2 = page[kStages], off2 = poff[kStages];
  int32_t pos3 = pos[kStages + 1];
  int32_t pos4 = pos[kStages + 2];
  uint32_t stage = 0;
  uint32_t issue_stage = kStages - 1;
#ifdef DSA_SA_TRACE
  stamp();  // the prologue's copies issued
#endif

  for (;;) {  // the CTA's units
    float o[16][4];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    }
    float m0 = kNeg, m1 = kNeg, l0 = 0.f, l1 = 0.f;  // rows g, g + 8 (l: this thread's columns only)

    for (int32_t j = 0; j < n; ++j) {
      {  // issue step j + kStages - 1, move the lookups along (steps past n belong to the next unit)
        const uint8_t* src = row_ptr(a, page1, off1, j + kStages - 1 < n ? h : nh, lane);
        const uint32_t dst = ring + issue_stage * kStageBytes;
        const uint32_t valid = j == 0 || j + kStages - 1 >= n ? issue_step<true>(dst, table, src, lane, a.k)
                                                             : issue_step<false>(dst, table, src, lane, a.k);
        if (lane == 0) {
          sts32(masks + 4 * issue_stage, valid);
        }
        cp_async_commit();
        issue_stage = issue_stage + 1 == kStages ? 0 : issue_stage + 1;
        page1 = page2;
        off1 = off2;
        page2 = page_of(j + kStages + 1 < n, pos3, off2);
        pos3 = pos4;
        pos4 = pos_of(j + kStages + 3);
        if (has_next && j + 3 == n && lane < 2 * a.group) {  // the next unit's q, into L2 before its merge
          asm volatile("prefetch.global.L2 [%0];" ::"l"(a.q + nrow * a.q_st + int64_t(nh * a.group + (lane >> 1)) *
                                                              a.q_sh + 64 * (lane & 1)));
        }
      }
      cp_async_wait<kStages - 1>();
      __syncwarp();
      const uint32_t sk = ring + stage * kStageBytes;
      const uint32_t sv = sk + kStep * kD;
      const uint32_t valid = lds32(masks + 4 * stage);
      stage = stage + 1 == kStages ? 0 : stage + 1;
      if (valid == 0) {  // no token of the step (past a short row's top-k, a padding row): nothing to add
        continue;
      }
      // S = q K^T for tokens 8 n + g (n8 tile n), this thread's columns 8 n + 2 t + {0, 1}.
      float s[2][4];
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint4 k0 = lds128(sk + k_chunk(g, 4 * half + t));
        const uint4 k1 = lds128(sk + k_chunk(8 + g, 4 * half + t));
        const uint32_t w0[4] = {k0.x, k0.y, k0.z, k0.w}, w1[4] = {k1.x, k1.y, k1.z, k1.w};
#pragma unroll
        for (int kq = 0; kq < 4; ++kq) {
          const uint4 qv = lds128(qs + 512u * (4 * half + kq));
          const uint32_t qa[4] = {qv.x, qv.y, qv.z, qv.w};
          uint32_t b0, b1;
          e4m3x4_to_f16x4(w0[kq], b0, b1);
          mma_f16(s[0], qa, b0, b1);
          e4m3x4_to_f16x4(w1[kq], b0, b1);
          mma_f16(s[1], qa, b0, b1);
        }
      }
      float mx0 = kNeg, mx1 = kNeg;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
          const bool ok = (valid >> (8 * n + 2 * t + e2)) & 1u;
          s[n][e2] = ok ? s[n][e2] * qk_scale.x : kNeg;  // row g
          s[n][2 + e2] = ok ? s[n][2 + e2] * qk_scale.y : kNeg;  // row g + 8
          mx0 = fmaxf(mx0, s[n][e2]);
          mx1 = fmaxf(mx1, s[n][2 + e2]);
        }
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      if (__any_sync(0xffffffffu, mx0 > m0 + kRescaleSlack || mx1 > m1 + kRescaleSlack)) {
        const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        const float al0 = exp2f(m0 - n0), al1 = exp2f(m1 - n1);
        m0 = n0;
        m1 = n1;
        l0 *= al0;
        l1 *= al1;
#pragma unroll
        for (int j2 = 0; j2 < 16; ++j2) {
          o[j2][0] *= al0;
          o[j2][1] *= al0;
          o[j2][2] *= al1;
          o[j2][3] *= al1;
        }
      }
      uint32_t pa[4];
#pragma unroll
      for (int n = 0; n < 2; ++n) {  // masked tokens: probability exactly 0 (their V bytes are stale)
        const bool ok0 = (valid >> (8 * n + 2 * t)) & 1u, ok1 = (valid >> (8 * n + 2 * t + 1)) & 1u;
        const float p0 = ok0 ? exp2f(s[n][0] - m0) : 0.f, p1 = ok1 ? exp2f(s[n][1] - m0) : 0.f;
        const float p2 = ok0 ? exp2f(s[n][2] - m1) : 0.f, p3 = ok1 ? exp2f(s[n][3] - m1) : 0.f;
        l0 += p0 + p1;
        l1 += p2 + p3;
        pa[2 * n] = pack_f16(p0, p1);
        pa[2 * n + 1] = pack_f16(p2, p3);
      }

      // O += P V: tokens 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1); tile j2's column g is value column 16 g + j2.
      const uint4 va = lds128(sv + v_chunk(2 * t, g));
      const uint4 vb = lds128(sv + v_chunk(2 * t + 1, g));
      const uint4 vc = lds128(sv + v_chunk(2 * t + 8, g));
      const uint4 vd = lds128(sv + v_chunk(2 * t + 9, g));
      const uint32_t wa[4] = {va.x, va.y, va.z, va.w}, wb[4] = {vb.x, vb.y, vb.z, vb.w};
      const uint32_t wc[4] = {vc.x, vc.y, vc.z, vc.w}, wd[4] = {vd.x, vd.y, vd.z, vd.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        uint32_t lo0, hi0, lo1, hi1, lo2, hi2, lo3, hi3;
        e4m3x4_to_f16x4(prmt(wa[w], wb[w], 0x5140u), lo0, hi0);  // bytes 4w, 4w + 1 of tokens 2t, 2t + 1
        e4m3x4_to_f16x4(prmt(wa[w], wb[w], 0x7362u), lo1, hi1);  // bytes 4w + 2, 4w + 3
        e4m3x4_to_f16x4(prmt(wc[w], wd[w], 0x5140u), lo2, hi2);
        e4m3x4_to_f16x4(prmt(wc[w], wd[w], 0x7362u), lo3, hi3);
        mma_f16(o[4 * w + 0], pa, lo0, lo2);
        mma_f16(o[4 * w + 1], pa, hi0, hi2);
        mma_f16(o[4 * w + 2], pa, lo1, lo3);
        mma_f16(o[4 * w + 3], pa, hi1, hi3);
      }
      __syncwarp();  // every lane's reads of this stage are done before it is refilled
    }

    // Merge the warps into this unit's output through each warp's free stage (the one its step n - 1 used, or
    // one never issued; the next unit's first steps are in flight in the other two) and its address table,
    // which holds the warp's row maxima and sums and the free stage's address meanwhile.
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if (!has_next) {
      pdl_launch_dependents();
    }
    const uint32_t free_stage = ring + (stage == 0 ? kStages - 1 : stage - 1) * kStageBytes;
    if (t == 0) {
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(table + 8u * g), "f"(m0), "f"(l0) : "memory");
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(table + 8u * (g + 8)), "f"(m1), "f"(l1) : "memory");
    }
    if (lane == 0) {
      asm volatile("st.shared.u32 [%0], %1;" ::"r"(table + 128u), "r"(free_stage) : "memory");
    }
    write_half<0>(o, free_stage, g, t);
    __syncthreads();
    // Threads 0 .. 127 merge: thread (head row hr, MMA column cn: value columns 16 cn + [0, 16)).
    const bool merger = threadIdx.x < kMergeThreads;
    const int hr = int(threadIdx.x >> 3) & (kHeads - 1);
    const int cn = int(threadIdx.x & 7);
    const uint32_t tables = smem_base + uint32_t(C::kTableOff);
    const bool partial = a.splits > 1 && !unsplit;
    float mm = kNeg, den = 0.f, acc[8];
    if (merger) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        float mw;
        asm volatile("ld.shared.f32 %0, [%1];" : "=f"(mw) : "r"(tables + uint32_t(w * 32 * 8) + 8u * hr));
        mm = fmaxf(mm, mw);
      }
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        float mw, lw;
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];"
                     : "=f"(mw), "=f"(lw)
                     : "r"(tables + uint32_t(w * 32 * 8) + 8u * hr));
        den += exp2f(mw - mm) * lw;
      }
      sum_half<kWarps>(tables, mm, hr, cn, acc);
      store_cols8(a, acc, 16 * cn, den > 0.f ? a.out_scale / den : 0.f, partial, piece, row, h, hr);
      if (partial && cn == 0) {
        a.ml[piece * 2 * kHeads + hr] = mm;
        a.ml[piece * 2 * kHeads + kHeads + hr] = den;
      }
    }
    __syncthreads();
    write_half<1>(o, free_stage, g, t);
    __syncthreads();
    if (merger) {
      sum_half<kWarps>(tables, mm, hr, cn, acc);
      store_cols8(a, acc, 16 * cn + 8, den > 0.f ? a.out_scale / den : 0.f, partial, piece, row, h, hr);
    }
#ifdef DSA_SA_TRACE
    stamp();
#endif
    if (!has_next) {
      break;
    }
    // Next unit: its lookups are in the registers above and its first steps in flight.
    unit += stride;
    row = nrow;
    h = nh;
    req_ok = nreq_ok;
    idx_row = nidx_row;
    bt_row = nbt_row;
    has_next = unit + stride < a.units;
    if (has_next) {
      const int64_t nitem = unit + stride;
      nrow = nitem / a.hkv;
      nh = int(nitem - nrow * a.hkv);
      nidx_row = a.idx + nrow * a.i_st;
      nreq = nnreq;
      nreq_ok = nreq >= 0 && nreq < a.num_reqs;
      nbt_row = a.bt + int64_t(nreq_ok ? nreq : 0) * a.bt_sr;
      nnreq = ldg_if(nitem + stride < a.units, a.t2r + (nitem + stride) / a.hkv * a.t2r_s, -1);
    }
    qk_scale = stage_q(a, row, h, qs, warp, g, t);
    __syncthreads();  // the merge's reads are done before a stage or table is reused; the new q is visible
  }
  cp_async_wait<0>();
#ifdef DSA_SA_TRACE
  if (threadIdx.x == 0) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    if (blockIdx.x < kTraceCtas) {
      g_trace[blockIdx.x][0] = (static_cast<unsigned long long>(smid) << 32) | unsigned(trace_n);
      for (int i = 0; i < kTraceMax; ++i) {
        g_trace[blockIdx.x][i + 1] = trace_ns[i];
      }
    }
    __threadfence();
    if (atomicAdd(&g_trace_done, 1u) == gridDim.x - 1) {  // the last CTA: every other row is written
      __threadfence();
      for (unsigned b = 0; b < min(gridDim.x, unsigned(kTraceCtas)); ++b) {
        const volatile unsigned long long* r = g_trace[b];
        printf("satrace %u %u %u %llu %llu %llu %llu %llu %llu %llu %llu\n", b, unsigned(r[0] >> 32),
               unsigned(r[0] & 0xffffffffu), r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8]);
      }
      g_trace_done = 0;
    }
  }
#endif
#endif  // DSA_SMXX_SA_DEVICE
}

// out[row, head] = sum_s 2^(m_s - M) O_s / sum_s 2^(m_s - M) l_s over the splits; one CTA a (row, KV head),
// a thread 16 value columns of one head row.
__global__ void __launch_bounds__(kCombineThreads) sparse_attention_combine_kernel(const __grid_constant__ CombineArgs a) {
#if DSA_SMXX_SA_DEVICE
  pdl_wait();
  pdl_launch_dependents();
  const int64_t slot = blockIdx.x;  // split item a.item0 + slot
  const int64_t item = a.item0 + slot;
  const int64_t row = item / a.hkv;
  const int h = int(item - row * a.hkv);
  const int hr = int(threadIdx.x >> 3);
  const int c0 = int(threadIdx.x & 7) * 16;
  if (hr >= a.group) {
    return;
  }
  const float* ml = a.ml + slot * a.splits * 2 * kHeads;
  float mm = kNeg;
  for (int sp = 0; sp < a.splits; ++sp) {
    mm = fmaxf(mm, ml[sp * 2 * kHeads + hr]);
  }
  float den = 0.f, acc[16];
#pragma unroll
  for (int c = 0; c < 16; ++c) {
    acc[c] = 0.f;
  }
  for (int sp = 0; sp < a.splits; ++sp) {
    const float wt = exp2f(ml[sp * 2 * kHeads + hr] - mm);
    den += wt * ml[sp * 2 * kHeads + kHeads + hr];
    const float4* src = reinterpret_cast<const float4*>(a.part + ((slot * a.splits + sp) * kHeads + hr) * kD + c0);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float4 v = __ldg(src + c);
      acc[4 * c] += wt * v.x;
      acc[4 * c + 1] += wt * v.y;
      acc[4 * c + 2] += wt * v.z;
      acc[4 * c + 3] += wt * v.w;
    }
  }
  store_row16(a.out + row * a.o_st + int64_t(h * a.group + hr) * a.o_sh + c0, acc,
              den > 0.f ? a.out_scale / den : 0.f);
#endif  // DSA_SMXX_SA_DEVICE
}

}  // namespace smxx_sparse_attention
}  // namespace dsa_cuda
