// Launcher of dsa.sparse_mla_decode: the SM90 kernel (include/dsa_cuda/sm90_sparse_mla_decode.cuh) on
// compute capability 9.x (variant 0; variant 3, which the provider picks: sm90_sparse_mla_decode_ws.cuh, three
// warpgroup roles), the SM100 one (sm100_sparse_mla_decode.cuh; compiled, not run) on 10.x.
// Torch-free: the compile gates build this file alone with nvcc.
#include "dsa_cuda/sparse_mla_decode.cuh"

#include <algorithm>
#include <atomic>

namespace dsa_cuda {
namespace {

namespace k = smxx_mla_decode;  // shared constants, arguments, combine kernel
namespace k90 = sm90_mla_decode;
namespace k90ws = sm90_mla_decode_ws;
namespace k100 = sm100_mla_decode;

constexpr int64_t kMaxGrid = int64_t{1} << 31;

int64_t ceil_div(int64_t x, int64_t y) { return (x + y - 1) / y; }

// k90ws::kZeroRow's address on the current device, looked up once a device.
cudaError_t zero_row(const uint8_t** row) {
  static std::atomic<const void*> cache[kMaxDevices] = {};
  int device = 0;
  DSA_CUDA_CHECK(cudaGetDevice(&device));
  const void* hit = nullptr;
  DSA_CUDA_CHECK(per_device(cache, device, &hit, [](int, const void** v) {
    void* p = nullptr;
    const cudaError_t e = cudaGetSymbolAddress(&p, k90ws::kZeroRow);
    *v = p;
    return e;
  }));
  *row = static_cast<const uint8_t*>(hit);
  return cudaSuccess;
}

template <bool kV4, bool kSplit>
cudaError_t launch_decode(const k::KernelArgs& a, int64_t grid, bool sm100, int64_t variant, cudaStream_t stream) {
  if (variant == 3) {  // the three-role SM90 kernel
    constexpr auto kernel = &k90ws::sparse_mla_decode_ws_kernel<kV4, kSplit>;
    return launch_pdl_smem<kernel>(dim3(unsigned(grid)), dim3(k90ws::kThreads), k90ws::Cfg<kV4>::kSmemBytes,
                                   stream, a);
  }
  if (sm100) {
    constexpr auto kernel = &k100::sparse_mla_decode_kernel<kV4, kSplit>;
    return launch_pdl_smem<kernel>(dim3(unsigned(grid)), dim3(k100::kThreads), k100::Cfg<kV4>::kSmemBytes, stream,
                                   a);
  }
  constexpr auto kernel = &k90::sparse_mla_decode_kernel<kV4, kSplit>;
  return launch_pdl_smem<kernel>(dim3(unsigned(grid)), dim3(k90::kThreads), k90::Cfg<kV4>::kSmemBytes, stream, a);
}

}  // namespace

int64_t sparse_mla_decode_workspace_floats(int64_t batch, int64_t s_q, int64_t heads, int64_t splits) {
  if (splits <= 1) {
    return 0;
  }
  return batch * s_q * ceil_div(heads, k::kHeads) * splits * k::kHeads * (k::kDv + 2);
}

const char* sparse_mla_decode_unsupported(const SparseMlaDecodeParams& p) {
  if (p.heads <= 0 || p.heads % k::kHeads != 0) {
    return "the CUDA sparse MLA decode kernel takes a multiple of 64 heads";
  }
  if (p.variant != 0 && p.variant != 3) {
    return "variant must be 0 or 3 (the three-role kernel, SM90 only)";
  }
  if (p.splits < 1 || p.splits > 1024) {
    return "splits must be in [1, 1024]";
  }
  if (p.topk >= int64_t{INT32_MAX} - 3 * k::kTile) {  // the lean producer reads slots two tiles ahead
    return "the CUDA sparse MLA decode kernel takes top-k below 2^31 - 192";
  }
  if (p.page_size <= 0 || p.page_size > (int64_t{1} << 20) || p.num_blocks * p.page_size >= (int64_t{1} << 40)) {
    return "the CUDA sparse MLA decode kernel takes pages of 1 to 2^20 tokens and fewer than 2^40 slots";
  }
  if (p.batch * p.s_q * (p.heads / k::kHeads) * p.splits >= kMaxGrid || p.batch * p.s_q >= int64_t{INT32_MAX}) {
    return "the CUDA sparse MLA decode kernel takes fewer than 2^31 (token, head block, split) CTAs";
  }
  if (!is_aligned16(p.q) || (p.q_batch_stride * 2) % 16 != 0 || (p.q_token_stride * 2) % 16 != 0 ||
      (p.q_head_stride * 2) % 16 != 0) {
    return "the CUDA sparse MLA decode kernel needs q's data and batch/token/head strides 16-byte aligned";
  }
  if (!is_aligned16(p.kv_cache) || (p.num_blocks > 1 && p.page_stride % 16 != 0)) {
    return "the CUDA sparse MLA decode kernel needs kv_cache's data and page stride 16-byte aligned";
  }
  if ((reinterpret_cast<uintptr_t>(p.out) & 7u) != 0 || (p.out_batch_stride * 2) % 8 != 0 ||
      (p.out_token_stride * 2) % 8 != 0 || (p.out_head_stride * 2) % 8 != 0) {
    return "the CUDA sparse MLA decode kernel needs out's data and batch/token/head strides 8-byte aligned";
  }
  if (p.splits > 1 && (reinterpret_cast<uintptr_t>(p.workspace) & 15u) != 0) {
    return "the CUDA sparse MLA decode kernel needs a 16-byte aligned workspace";
  }
  return nullptr;
}

cudaError_t launch_sparse_mla_decode(const SparseMlaDecodeParams& p, cudaStream_t stream) {
  if (p.batch <= 0 || p.s_q <= 0 || p.heads <= 0) {
    return cudaSuccess;
  }
  if (sparse_mla_decode_unsupported(p) != nullptr) {
    return cudaErrorNotSupported;
  }
  int major = 0;
  DSA_CUDA_CHECK(current_arch_major(&major));
  if (major != 9 && major != 10) {  // wgmma on SM90, tcgen05 on the SM100 family; no kernel elsewhere
    return cudaErrorNotSupported;
  }
  const bool sm100 = major == 10;
  if (sm100 && p.variant != 0) {  // variant 3 is wgmma (SM90) only
    return cudaErrorNotSupported;
  }
  const int64_t head_blocks = p.heads / k::kHeads;
  const int64_t tiles = std::max<int64_t>(1, ceil_div(p.topk, k::kTile));
  const int64_t splits = std::min(p.splits, tiles);
  const int64_t per = ceil_div(tiles, splits);
  const int64_t programs = p.batch * p.s_q * head_blocks;

  k::KernelArgs a;
  a.q = static_cast<const uint8_t*>(p.q);
  a.cache = static_cast<const uint8_t*>(p.kv_cache);
  a.idx = p.indices;
  a.lens = p.topk_lens;
  a.sink = p.attn_sink;
  a.out = static_cast<__nv_bfloat16*>(p.out);
  a.lse = p.lse;
  a.part = p.workspace;
  a.ml = splits > 1 ? p.workspace + programs * splits * k::kHeads * k::kDv : nullptr;
  a.q_sb = p.q_batch_stride;
  a.q_ss = p.q_token_stride;
  a.q_sh = p.q_head_stride;
  a.i_sb = p.idx_batch_stride;
  a.i_ss = p.idx_token_stride;
  a.i_sn = p.idx_pos_stride;
  a.o_sb = p.out_batch_stride;
  a.o_ss = p.out_token_stride;
  a.o_sh = p.out_head_stride;
  a.lens_stride = p.topk_lens_stride;
  a.page_stride = p.num_blocks > 1 ? p.page_stride : p.page_size * (p.v4 ? 584 : 656);
  a.nslots = std::max<int64_t>(p.num_blocks, 0) * p.page_size;
  a.s_q = int32_t(p.s_q);
  a.heads = int32_t(p.heads);
  a.head_blocks = int32_t(head_blocks);
  a.topk = int32_t(p.topk);
  a.page = int32_t(p.page_size);
  const FastDiv page_div = make_fast_div(uint32_t(p.page_size));
  a.page_mul = page_div.mul;
  a.page_shift = page_div.shift;
  a.splits = int32_t(splits);
  a.tiles_per_split = int32_t(per);
  a.qk_scale = p.softmax_scale * k::kLog2e;
  a.zero_row = nullptr;  // variant 3's only
  if (p.variant == 3) {
    DSA_CUDA_CHECK(zero_row(&a.zero_row));
  }
  const int64_t grid = programs * splits;

  if (splits == 1) {
    return p.v4 ? launch_decode<true, false>(a, grid, sm100, p.variant, stream)
                : launch_decode<false, false>(a, grid, sm100, p.variant, stream);
  }
  const cudaError_t err = p.v4 ? launch_decode<true, true>(a, grid, sm100, p.variant, stream)
                               : launch_decode<false, true>(a, grid, sm100, p.variant, stream);
  DSA_CUDA_CHECK(err);
  k::CombineArgs c;
  c.part = a.part;
  c.ml = a.ml;
  c.sink = p.attn_sink;
  c.out = a.out;
  c.lse = p.lse;
  c.o_sb = p.out_batch_stride;
  c.o_ss = p.out_token_stride;
  c.o_sh = p.out_head_stride;
  c.s_q = a.s_q;
  c.heads = a.heads;
  c.head_blocks = a.head_blocks;
  c.splits = a.splits;
  return launch_pdl(&k::sparse_mla_combine_kernel, dim3(unsigned(programs * 8)), dim3(256), 0, stream, c);
}

}  // namespace dsa_cuda
