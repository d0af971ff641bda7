// Launcher of dsa.indexer_logits (kernel in include/dsa_cuda/sm90_indexer_logits.cuh).
// Torch-free: the compile gates build this file alone with nvcc.
#include "dsa_cuda/indexer_logits.cuh"

#include <algorithm>

namespace dsa_cuda {
namespace {

namespace k = sm90_indexer;

template <int kMode, int kHeads>
cudaError_t launch(const k::KernelArgs& a, int grid, cudaStream_t stream) {
  using C = k::Cfg<kMode>;
  constexpr auto kernel = &k::indexer_logits_kernel<kMode, kHeads>;
  return launch_pdl_smem<kernel>(dim3(unsigned(grid)), dim3(C::kThreads), C::kSmemBytes, stream, a);
}

template <int kMode>
cudaError_t launch_mode(const k::KernelArgs& a, int64_t heads, int grid, cudaStream_t stream) {
  return heads == 64 ? launch<kMode, 64>(a, grid, stream) : launch<kMode, 32>(a, grid, stream);
}

}  // namespace

const char* indexer_logits_unsupported(const IndexerLogitsParams& p) {
  if (p.heads != 32 && p.heads != 64) {
    return "the CUDA indexer kernel takes 32 or 64 heads";
  }
  if (p.head_dim != k::kDim) {
    return "the CUDA indexer kernel takes head dim 128";
  }
  if (p.rows >= int64_t{INT32_MAX}) {
    return "the CUDA indexer kernel takes fewer than 2^31 - 1 rows";
  }
  if (p.keys > int64_t{INT32_MAX} - 4 * k::kWgKeys) {
    return "the CUDA indexer kernel takes fewer than 2^31 - 256 keys";
  }
  const int64_t elem = p.dtype == IndexerDtype::kBf16 ? 2 : 1;
  if (!is_aligned16(p.q) || (p.q_row_stride * elem) % 16 != 0 || (p.q_head_stride * elem) % 16 != 0) {
    return "the CUDA indexer kernel needs q's data and row/head strides 16-byte aligned";
  }
  if (!is_aligned16(p.kv) || (p.kv_row_stride * elem) % 16 != 0) {
    return "the CUDA indexer kernel needs kv's data and row stride 16-byte aligned";
  }
  if (p.dtype == IndexerDtype::kFp8E4m3 && p.kv_scale == nullptr) {
    return "fp8 keys need kv_scale";
  }
  return nullptr;
}

cudaError_t launch_indexer_logits(const IndexerLogitsParams& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.keys <= 0) {
    return cudaSuccess;
  }
  if (indexer_logits_unsupported(p) != nullptr) {
    return cudaErrorNotSupported;
  }
  int major = 0;
  DSA_CUDA_CHECK(current_arch_major(&major));
  if (major != 9) {  // wgmma exists on SM90 only; an SM100 kernel is its own file
    return cudaErrorNotSupported;
  }
  int sms = 0;
  DSA_CUDA_CHECK(current_sm_count(&sms));

  const int64_t elem = p.dtype == IndexerDtype::kBf16 ? 2 : 1;
  const int64_t rows_per_item = k::kN / p.heads;
  const int64_t row_blocks = (p.rows + rows_per_item - 1) / rows_per_item;
  const int64_t tile_keys = k::Cfg<k::kFp8Mma>::kTileKeys;  // the same in every mode
  const int64_t key_tiles = (p.keys + tile_keys - 1) / tile_keys;
  // Chunks of at most kMaxChunkTiles tiles (bounded Q reloads), and enough items for every SM to have
  // several (load balance) when the rows alone do not give that.
  int64_t chunks = (key_tiles + k::kMaxChunkTiles - 1) / k::kMaxChunkTiles;
  chunks = std::max(chunks, std::min(key_tiles, (8 * int64_t(sms) + row_blocks - 1) / row_blocks));
  const int64_t chunk_tiles = (key_tiles + chunks - 1) / chunks;
  chunks = (key_tiles + chunk_tiles - 1) / chunk_tiles;

  k::KernelArgs a;
  a.q = static_cast<const uint8_t*>(p.q);
  a.kv = static_cast<const uint8_t*>(p.kv);
  a.kv_scale = p.kv_scale;
  a.weights = p.weights;
  a.ks = p.ks;
  a.ke = p.ke;
  a.out = p.out;
  a.rows = p.rows;
  a.q_row_stride = p.q_row_stride * elem;
  a.q_head_stride = p.q_head_stride * elem;
  a.kv_row_stride = p.kv_row_stride * elem;
  a.kv_scale_stride = p.kv_scale_stride;
  a.w_row_stride = p.weights_row_stride;
  a.w_head_stride = p.weights_head_stride;
  a.ks_stride = p.ks_stride;
  a.ke_stride = p.ke_stride;
  a.out_row_stride = p.out_row_stride;
  a.row_blocks = int32_t(row_blocks);
  a.chunks = int32_t(chunks);
  const int64_t items = row_blocks * chunks;
  a.keys = int32_t(p.keys);
  a.key_tiles = int32_t(key_tiles);
  a.chunk_tiles = int32_t(chunk_tiles);
  a.clean = p.clean;
  const int grid = int(std::min<int64_t>(items, sms));

  if (p.dtype == IndexerDtype::kBf16) {
    return launch_mode<k::kBf16>(a, p.heads, grid, stream);
  }
  return p.fp8_mma ? launch_mode<k::kFp8Mma>(a, p.heads, grid, stream)
                   : launch_mode<k::kFp8AsF16>(a, p.heads, grid, stream);
}

}  // namespace dsa_cuda
