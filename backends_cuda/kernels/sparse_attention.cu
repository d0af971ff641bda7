// Launcher of dsa.sparse_attention over an fp8 cache: include/dsa_cuda/smxx_sparse_attention.cuh on compute
// capability 9.x (run) and 10.x (compiled, not run). Torch-free: the compile gates build this file alone.
#include "dsa_cuda/sparse_attention.cuh"

#include <algorithm>

namespace dsa_cuda {
namespace {

namespace k = smxx_sparse_attention;

constexpr int64_t kMaxGrid = (int64_t{1} << 31) - 1;
constexpr float kLog2e = 1.4426950408889634f;

int64_t ceil_div(int64_t x, int64_t y) { return (x + y - 1) / y; }

bool mult16(int64_t bytes) { return bytes % 16 == 0; }

}  // namespace

int64_t sparse_attention_workspace_floats(int64_t rows, int64_t kv_heads, int64_t splits, int64_t whole) {
  const int64_t split_items = rows * kv_heads - std::min(std::max<int64_t>(whole, 0), rows * kv_heads);
  if (splits <= 1) {
    return 0;
  }
  return split_items * splits * k::kHeads * (k::kD + 2);
}

const char* sparse_attention_unsupported(const SparseAttentionParams& p) {
  if (p.kv_heads <= 0 || p.q_heads % p.kv_heads != 0 || p.q_heads / p.kv_heads > k::kHeads) {
    return "the CUDA sparse attention kernel takes 1 to 16 query heads per KV head";
  }
  if (p.topk >= (int64_t{1} << 30)) {
    return "the CUDA sparse attention kernel takes top-k below 2^30";
  }
  if (p.page_size <= 0 || p.num_blocks >= (int64_t{1} << 31) || p.max_pages >= (int64_t{1} << 31) ||
      p.num_reqs >= (int64_t{1} << 31) || p.page_size * p.max_pages >= (int64_t{1} << 31)) {
    return "the CUDA sparse attention kernel takes int32 block ids, page counts and request-relative positions";
  }
  if (p.whole < 0) {
    return "the CUDA sparse attention kernel takes a split tail's `whole` >= 0";
  }
  if (p.splits < 1 || p.rows * p.kv_heads * p.splits > kMaxGrid) {
    return "the CUDA sparse attention kernel takes fewer than 2^31 (row, KV head, split) CTAs";
  }
  if (!is_aligned16(p.q) || !mult16(p.q_row_stride * 2) || !mult16(p.q_head_stride * 2)) {
    return "the CUDA sparse attention kernel needs q's data and row/head strides 16-byte aligned";
  }
  if (!is_aligned16(p.k_cache) || !is_aligned16(p.v_cache) || !mult16(p.k_block_stride) ||
      !mult16(p.k_page_stride) || !mult16(p.k_head_stride) || !mult16(p.v_block_stride) ||
      !mult16(p.v_page_stride) || !mult16(p.v_head_stride)) {
    return "the CUDA sparse attention kernel needs the caches' data and block/token/head strides 16-byte aligned";
  }
  if (p.cta_warps != 0 && p.cta_warps != 4 && p.cta_warps != 16) {
    return "the CUDA sparse attention kernel takes CTAs of 4 or 16 warps (0: its own choice)";
  }
  if (p.splits > 1 && (reinterpret_cast<uintptr_t>(p.workspace) & 15u) != 0) {
    return "the CUDA sparse attention kernel needs a 16-byte aligned workspace";
  }
  return nullptr;
}

cudaError_t launch_sparse_attention(const SparseAttentionParams& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.q_heads <= 0) {
    return cudaSuccess;
  }
  if (sparse_attention_unsupported(p) != nullptr) {
    return cudaErrorNotSupported;
  }
  int major = 0;
  DSA_CUDA_CHECK(current_arch_major(&major));
  if (major != 9 && major != 10) {
    return cudaErrorNotSupported;
  }
  const int64_t steps = std::max<int64_t>(1, ceil_div(p.topk, k::kStep));
  const int64_t splits = std::min(p.splits, steps);
  const int64_t per = ceil_div(steps, splits);
  const int64_t used = ceil_div(steps, per);  // no empty split
  const int64_t items = p.rows * p.kv_heads;
  const int64_t whole = used > 1 ? std::min(p.whole, items) : 0;  // split tail: items run unsplit first
  const int64_t split_items = items - whole;

  k::KernelArgs a;
  a.q = static_cast<const __nv_bfloat16*>(p.q);
  a.k = static_cast<const uint8_t*>(p.k_cache);
  a.v = static_cast<const uint8_t*>(p.v_cache);
  a.idx = p.indices;
  a.bt = p.block_table;
  a.t2r = p.token_to_req;
  a.out = static_cast<__nv_bfloat16*>(p.out);
  a.part = used > 1 ? p.workspace : nullptr;
  a.ml = used > 1 ? p.workspace + split_items * used * k::kHeads * k::kD : nullptr;
  a.q_st = p.q_row_stride;
  a.q_sh = p.q_head_stride;
  a.k_sb = p.k_block_stride;
  a.k_sp = p.k_page_stride;
  a.k_sh = p.k_head_stride;
  a.v_sb = p.v_block_stride;
  a.v_sp = p.v_page_stride;
  a.v_sh = p.v_head_stride;
  a.i_st = p.idx_row_stride;
  a.i_sn = p.idx_pos_stride;
  a.bt_sr = p.bt_req_stride;
  a.bt_sp = p.bt_page_stride;
  a.t2r_s = p.t2r_stride;
  a.o_st = p.out_row_stride;
  a.o_sh = p.out_head_stride;
  a.topk = int32_t(p.topk);
  a.num_blocks = int32_t(p.num_blocks);
  a.num_reqs = int32_t(p.num_reqs);
  a.max_pages = int32_t(p.max_pages);
  a.page = int32_t(p.page_size);
  a.page_shift = -1;
  for (int b = 0; b < 31; ++b) {
    if (p.page_size == (int64_t{1} << b)) {
      a.page_shift = b;
    }
  }
  a.group = int32_t(p.q_heads / p.kv_heads);
  a.hkv = int32_t(p.kv_heads);
  a.splits = int32_t(used);
  a.steps_per_split = int32_t(per);
  a.out_aligned16 = is_aligned16(p.out) && mult16(p.out_row_stride * 2) && mult16(p.out_head_stride * 2);
  a.qk_scale = p.softmax_scale * p.k_scale * kLog2e;
  a.out_scale = p.v_scale;

  a.whole = whole;
  a.units = whole + split_items * used;
  // CTAs of 16 warps (one an SM, a unit's steps over all 16) for one split of at most one unit an SM, else of 4
  // warps (4 an SM). Past one wave the 16-warp CTAs lose: every unit's merge syncs the whole SM (H200, 400 rows
  // x 2 KV heads: 155.6 us against 128.7; providers_sparse_attention.WIDE_MIN_ITEMS has the one-wave figures).
  int sms = 0;
  DSA_CUDA_CHECK(current_sm_count(&sms));
  const int warps = p.cta_warps != 0 ? int(p.cta_warps) : used == 1 && a.units <= sms ? 16 : 4;
  if (warps == 16) {  // one CTA a unit
    using C = k::Cta<16>;
    DSA_CUDA_CHECK((launch_pdl_smem<&k::sparse_attention_fp8_kernel<16>>(
        dim3(static_cast<unsigned>(a.units)), dim3(C::kThreads), C::kSmemBytes, stream, a)));
  } else {
    // A persistent grid (a CTA per slot, each taking units in turn with the next unit's lookups and first copies
    // under the current one's last steps) where the rule allows several units a CTA; else one CTA a unit.
    using C = k::Cta<4>;
    const int64_t ctas = used == 1 && steps >= C::kMultiUnitMinSteps
                             ? std::min<int64_t>(a.units, int64_t(sms) * C::kPerSm)
                             : a.units;
    DSA_CUDA_CHECK((launch_pdl_smem<&k::sparse_attention_fp8_kernel<4>>(
        dim3(static_cast<unsigned>(ctas)), dim3(C::kThreads), C::kSmemBytes, stream, a)));
  }
  if (used == 1 || split_items == 0) {
    return cudaSuccess;
  }
  k::CombineArgs c;
  c.part = a.part;
  c.ml = a.ml;
  c.item0 = whole;
  c.out = a.out;
  c.o_st = a.o_st;
  c.o_sh = a.o_sh;
  c.group = a.group;
  c.hkv = a.hkv;
  c.splits = a.splits;
  c.out_scale = a.out_scale;
  return launch_pdl(&k::sparse_attention_combine_kernel, dim3(unsigned(split_items)), dim3(k::kCombineThreads), 0,
                    stream, c);
}

}  // namespace dsa_cuda
