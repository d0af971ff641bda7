// Launcher of dsa.indexer_logits (kernel in include/dsa_cuda/sm90_indexer_logits.cuh).
// Torch-free: the compile gates build this file alone with nvcc.
#include "dsa_cuda/indexer_logits.cuh"

#include <algorithm>

namespace dsa_cuda {
namespace {

namespace k = sm90_indexer;

template <int kMode, int kHeads, int kWgs, bool kSS>
cudaError_t launch(const k::KernelArgs& a, int grid, cudaStream_t stream) {
  using C = k::Cfg<kMode, kWgs>;
  constexpr auto kernel = &k::indexer_logits_kernel<kMode, kHeads, kWgs, kSS>;
  return launch_pdl_smem<kernel>(dim3(unsigned(grid)), dim3(C::kThreads), C::kSmemBytes, stream, a);
}

template <int kMode, int kHeads>
cudaError_t launch_heads(const k::KernelArgs& a, int wgs, int grid, cudaStream_t stream) {
  return wgs == 3 ? launch<kMode, kHeads, 3, false>(a, grid, stream) : launch<kMode, kHeads, 2, false>(a, grid, stream);
}

template <int kMode>
cudaError_t launch_variant(const k::KernelArgs& a, int64_t heads, int wgs, int grid, cudaStream_t stream) {
  return heads == 64 ? launch_heads<kMode, 64>(a, wgs, grid, stream) : launch_heads<kMode, 32>(a, wgs, grid, stream);
}

// e4m3 MMA with A from shared memory: 2, 3 or 4 math warpgroups.
template <int kHeads>
cudaError_t launch_ss(const k::KernelArgs& a, int wgs, int grid, cudaStream_t stream) {
  if (wgs == 4) {
    return launch<k::kFp8Mma, kHeads, 4, true>(a, grid, stream);
  }
  return wgs == 3 ? launch<k::kFp8Mma, kHeads, 3, true>(a, grid, stream)
                  : launch<k::kFp8Mma, kHeads, 2, true>(a, grid, stream);
}

// The variant a config runs (IndexerLogitsParams::config), defaults filled in: the one place the
// defaults are chosen. Default: 2 math warpgroups, A from registers. H200, 4096 rows, H 64, fp8 MMA, us
// (32768 causal / 131072 causal): registers 2866 / 11555, 3 warpgroups 4020 / 16358; shared-memory A
// 2 warpgroups 2970 / 12094, 3: 4038 / 16509, 4: 3847 / 15738 (docs/design_indexer.md).
struct Variant {
  int wgs;
  bool ss;
};

Variant resolve(int32_t config) {
  const int wgs = config % 10, operand = config / 10;
  const bool ss = operand == 2 || (operand == 0 && wgs == 4);
  return Variant{wgs == 0 ? 2 : wgs, ss};
}

}  // namespace

const char* indexer_logits_unsupported(const IndexerLogitsParams& p) {
  if (p.heads != 32 && p.heads != 64) {
    return "the CUDA indexer kernel takes 32 or 64 heads";
  }
  if (p.head_dim != k::kDim) {
    return "the CUDA indexer kernel takes head dim 128";
  }
  if (p.config < 0 || p.config > 24 || p.config % 10 == 1 || p.config % 10 > 4) {
    return "config must be 2 decimal digits: A operand 0-2 (0 default, 1 registers, 2 shared memory), "
           "math warpgroups 0, 2, 3 or 4";
  }
  const Variant v = resolve(p.config);
  if (v.ss && (p.dtype != IndexerDtype::kFp8E4m3 || !p.fp8_mma)) {
    return "config's shared-memory A operand (and 4 math warpgroups) takes fp8 operands in the fp8 MMA mode";
  }
  if (v.wgs == 4 && !v.ss) {
    return "config's 4 math warpgroups take the shared-memory A operand";
  }
  if (p.rows >= int64_t{INT32_MAX}) {
    return "the CUDA indexer kernel takes fewer than 2^31 - 1 rows";
  }
  if (p.keys > int64_t{INT32_MAX} - 8 * k::kWgKeys) {
    return "the CUDA indexer kernel takes fewer than 2^31 - 512 keys";
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
  const Variant v = resolve(p.config);
  const int wgs = v.wgs;
  const int64_t tile_keys = k::kWgKeys * wgs;
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
    return launch_variant<k::kBf16>(a, p.heads, wgs, grid, stream);
  }
  if (v.ss) {
    return p.heads == 64 ? launch_ss<64>(a, wgs, grid, stream) : launch_ss<32>(a, wgs, grid, stream);
  }
  return p.fp8_mma ? launch_variant<k::kFp8Mma>(a, p.heads, wgs, grid, stream)
                   : launch_variant<k::kFp8AsF16>(a, p.heads, wgs, grid, stream);
}

}  // namespace dsa_cuda
